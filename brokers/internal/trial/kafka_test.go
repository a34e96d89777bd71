package trial_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactlyonce/idempotency/brokers"
	"github.com/exactlyonce/idempotency/chaos"
)

// kafkaPartitions is the partitions of a trial's topic: enough for the
// group to split them between two consumers.
const kafkaPartitions = 4

// kafkaBrokers returns the seed brokers of IDEM_KAFKA_BROKERS (a real
// cluster, comma-separated addresses on loopback) and its label, or else
// starts franz-go's in-process Kafka (kfake) for the test.
func kafkaBrokers(t testing.TB) ([]string, string) {
	t.Helper()
	if v := os.Getenv("IDEM_KAFKA_BROKERS"); v != "" {
		chaos.ServerEnv(t, "IDEM_KAFKA_BROKERS") // loopback only
		return strings.Split(v, ","), "Kafka (IDEM_KAFKA_BROKERS)"
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c.ListenAddrs(), "Kafka (franz-go's kfake, in-process)"
}

type kafkaEnv struct {
	label, topic string
	seeds        []string
	adm          *kadm.Client
}

func (e *kafkaEnv) name() string  { return e.label }
func (e *kafkaEnv) stopped() bool { return false }

func (e *kafkaEnv) prepare(t *testing.T, trial string, msgs []testMsg) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e.topic = trial
	if _, err := e.adm.CreateTopic(ctx, kafkaPartitions, 1, nil, trial); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.adm.DeleteTopics(context.Background(), trial) })
	produceKafka(t, ctx, e.seeds, trial, msgs)
	return []string{"-broker", "kafka", "-url", strings.Join(e.seeds, ","), "-name", trial, "-group", trial}
}

// produceKafka writes msgs to topic, keyed by event ID (so spread over
// the partitions), each with its ID in the brokers.KafkaIDHeader header.
func produceKafka(t testing.TB, ctx context.Context, seeds []string, topic string, msgs []testMsg) {
	t.Helper()
	p, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	recs := make([]*kgo.Record, len(msgs))
	for i, m := range msgs {
		recs[i] = &kgo.Record{Key: []byte(m.id), Value: m.payload, Headers: []kgo.RecordHeader{{Key: brokers.KafkaIDHeader, Value: []byte(m.id)}}}
	}
	if err := p.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

// drained: the group has committed every partition's end offset.
func (e *kafkaEnv) drained(t *testing.T) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ends, err := e.adm.ListEndOffsets(ctx, e.topic)
	if err != nil {
		t.Fatalf("end offsets: %v", err)
	}
	committed, err := e.adm.FetchOffsets(ctx, e.topic) // the group is named as the topic
	if err != nil {
		t.Fatalf("committed offsets: %v", err)
	}
	done := true
	ends.Each(func(o kadm.ListedOffset) {
		c, ok := committed.Lookup(o.Topic, o.Partition)
		if !ok || c.At < o.Offset {
			done = false
		}
	})
	return done
}

// joinPlan: the first consumer pauses in the middle of a batch (after an
// effect, or before the batch's first one), the second joins the group
// and gets partitions, and the first goes on: its batch ends on partitions
// the group has given away.
func (e *kafkaEnv) joinPlan(tr chaos.Trial, batch int) plan {
	if chaos.Pick(tr, pointEffect, pointFirstEffect) == pointFirstEffect {
		return plan{point: pointFirstEffect, at: tr.Rand.IntN(3), join: true}
	}
	return plan{point: pointEffect, at: tr.Rand.IntN(batch), join: true}
}

// TestKafka runs the trials on Kafka: a real broker from
// IDEM_KAFKA_BROKERS, else franz-go's kfake in the test process. The
// group's second consumer joins in the middle of the first one's batch (a
// rebalance that moves partitions whose records are being handled), the
// consumers are static members (a restarted one gets its partitions back
// at once), transient failures are handled again in place, and killed
// consumers' uncommitted records are delivered again.
func TestKafka(t *testing.T) {
	seeds, label := kafkaBrokers(t)
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	runModes(t, &kafkaEnv{label: label, seeds: seeds, adm: kadm.NewClient(cl)})
}
