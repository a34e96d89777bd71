package mongo_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	idemmongo "github.com/exactlyonce/idempotency/store/mongo"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// TestStuckIndex checks the partial index of STARTED records on the
// server: Migrate creates it ({l: 1, _id: 1} for state "started"), and
// the server answers Stuck's query from it, examining only the stuck
// records, not the completed ones nor the live holders beside them.
func TestStuckIndex(t *testing.T) {
	c := server(t)
	coll := freshCollection(t, c)
	s := newStore(t, coll, nil)
	ctx := context.Background()
	raw, err := coll.Database().RunCommand(ctx, bson.D{{Key: "listIndexes", Value: coll.Name()}}).Raw()
	if err != nil {
		t.Fatal(err)
	}
	batch, _ := raw.Lookup("cursor", "firstBatch").Array().Values()
	type spec struct {
		Key     bson.D `bson:"key"`
		Partial bson.D `bson:"partialFilterExpression"`
	}
	var index *spec
	for _, v := range batch {
		if name, _ := v.Document().Lookup("name").StringValueOK(); name == "idem_started" {
			index = new(spec)
			if err := bson.Unmarshal(v.Document(), index); err != nil {
				t.Fatal(err)
			}
		}
	}
	switch {
	case index == nil:
		t.Fatalf("no index idem_started: %s", raw)
	case fmt.Sprint(index.Key) != `[{l 1} {_id 1}]` || fmt.Sprint(index.Partial) != `[{s started}]`:
		t.Errorf("index idem_started: key %v, partial filter %v; want {l: 1, _id: 1} for {s: \"started\"}", index.Key, index.Partial)
	}

	const completed, live, stuck = 2000, 200, 10
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	for i := range completed + live + stuck {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			key, lease := fmt.Sprintf("k-%05d", i), time.Hour
			if i >= completed+live {
				lease = time.Second
			}
			if _, err := s.Claim(ctx, idempotency.ClaimRequest{Key: key, Fingerprint: "fp", Token: "tok", Lease: lease, Grace: time.Hour}); err != nil {
				t.Error(err)
				return
			}
			if i < completed {
				if err := s.Complete(ctx, key, "tok", []byte("r"), time.Hour); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	time.Sleep(1500 * time.Millisecond)
	filter, sort := idemmongo.StuckQuery(serverNow(t, c))
	raw, err = coll.Database().RunCommand(ctx, bson.D{
		{Key: "explain", Value: bson.D{{Key: "find", Value: coll.Name()}, {Key: "filter", Value: filter}, {Key: "sort", Value: sort}, {Key: "limit", Value: 100}}},
		{Key: "verbosity", Value: "executionStats"},
	}).Raw()
	if err != nil {
		t.Fatal(err)
	}
	plan := raw.Lookup("queryPlanner", "winningPlan").String()
	examined, _ := raw.Lookup("executionStats", "totalDocsExamined").AsInt64OK()
	keysExamined, _ := raw.Lookup("executionStats", "totalKeysExamined").AsInt64OK()
	returned, _ := raw.Lookup("executionStats", "nReturned").AsInt64OK()
	t.Logf("Stuck's query among %d completed, %d live and %d stuck records: %d keys and %d documents examined, %d returned; plan %s", completed, live, stuck, keysExamined, examined, returned, plan)
	if !strings.Contains(plan, "idem_started") || strings.Contains(plan, "COLLSCAN") || examined > stuck+2 || returned != stuck {
		t.Errorf("Stuck's query examined %d documents (returned %d) with the plan %s; want an index scan of idem_started that reads the %d stuck records only", examined, returned, plan, stuck)
	}
	infos, next, err := s.Stuck(ctx, "", 100)
	if err != nil || len(infos) != stuck || next != "" {
		t.Errorf("Stuck: %d records, cursor %q, %v; want %d", len(infos), next, err, stuck)
	}
}
