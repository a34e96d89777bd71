package crashtrial_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/httpidem"
	"github.com/exactlyonce/idempotency/queue"
)

// Submitting a backlog of b.N 1 KiB requests to a local httpidem server
// on PostgreSQL or Redis (in this process, over loopback), beside the same
// requests sent straight to it by a plain client, one at a time or four at
// once (four ordering keys for the queue): the queue's rate over the
// server's alone is the figure. rt-µs/item is the mean round trip (the
// server's time as the client sees it); queue-µs/item, one at a time, the
// rest of an item's time: the queue's own.
func BenchmarkSubmit(b *testing.B) {
	pg, rs := stores(b)
	for _, st := range []struct {
		name  string
		store idempotency.Store
	}{{"postgres", pg}, {"redis", rs}} {
		srv := serve(b, st.store, 1)
		srv.calm = true
		for _, par := range []int{1, 4} {
			b.Run(fmt.Sprintf("%s/server-alone/conc-%d", st.name, par), func(b *testing.B) {
				tr := &http.Transport{MaxIdleConnsPerHost: par}
				defer tr.CloseIdleConnections()
				var next atomic.Int64
				var wg sync.WaitGroup
				var rt atomic.Int64
				b.ResetTimer()
				for range par {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for i := next.Add(1); i <= int64(b.N); i = next.Add(1) {
							req := kibRequest(srv.url, int(i), par)
							httpidem.SetKey(req, httpidem.NewKey())
							t0 := time.Now()
							resp, err := tr.RoundTrip(req)
							if err != nil {
								b.Error(err)
								return
							}
							io.Copy(io.Discard, resp.Body)
							resp.Body.Close()
							rt.Add(int64(time.Since(t0)))
							if resp.StatusCode != 201 {
								b.Errorf("status %d", resp.StatusCode)
								return
							}
						}
					}()
				}
				wg.Wait()
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "items/s")
				b.ReportMetric(float64(rt.Load())/1e3/float64(b.N), "rt-µs/item")
			})
			b.Run(fmt.Sprintf("%s/queue/conc-%d", st.name, par), func(b *testing.B) {
				tr := &timed{base: &http.Transport{MaxIdleConnsPerHost: par}}
				defer tr.base.CloseIdleConnections()
				var done atomic.Int64
				q, err := queue.Open(filepath.Join(b.TempDir(), "q"), queue.WithTransport(tr), queue.WithConcurrency(par),
					queue.WithOnDone(func(ctx context.Context, it *queue.Item) error {
						if it.Response.Status != 201 {
							return fmt.Errorf("status %d", it.Response.Status)
						}
						done.Add(1)
						return nil
					}))
				if err != nil {
					b.Fatal(err)
				}
				defer q.Close()
				fill(b, q, srv.url, par)
				ctx, cancel := context.WithCancel(context.Background())
				go func() {
					for done.Load() < int64(b.N) {
						time.Sleep(100 * time.Microsecond)
					}
					cancel()
				}()
				b.ResetTimer()
				q.Run(ctx)
				b.StopTimer()
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "items/s")
				rt := float64(tr.rt.Load()) / 1e3 / float64(b.N)
				b.ReportMetric(rt, "rt-µs/item")
				// One at a time, what an item costs besides its round trip
				// is the queue's own time.
				if par == 1 {
					b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)-rt, "queue-µs/item")
				}
			})
		}
	}
}

// timed is a RoundTripper that adds up the time of its round trips, the
// reading of the answers included.
type timed struct {
	base *http.Transport
	rt   atomic.Int64
}

func (t *timed) RoundTrip(req *http.Request) (*http.Response, error) {
	t0 := time.Now()
	resp, err := t.base.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	resp.Body = &timedBody{ReadCloser: resp.Body, t: t, t0: t0}
	return resp, nil
}

type timedBody struct {
	io.ReadCloser
	t  *timed
	t0 time.Time
}

func (b *timedBody) Close() error {
	b.t.rt.Add(int64(time.Since(b.t0)))
	return b.ReadCloser.Close()
}

// kibRequest is a 1 KiB request of the server's, for item i of orders.
func kibRequest(url string, i, orders int) *http.Request {
	body, _ := json.Marshal(struct {
		item
		Pad string `json:"pad"`
	}{item{Trial: -1, Index: i, Order: fmt.Sprint(i % orders), Seq: i}, strings.Repeat("p", 960)})
	req, _ := http.NewRequest("POST", url, strings.NewReader(string(body)))
	req.Header.Set("Content-Type", "application/json")
	return req
}

// fill enqueues b.N requests from 32 goroutines, which share flushes.
func fill(b *testing.B, q *queue.Queue, url string, orders int) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1); i <= int64(b.N); i = next.Add(1) {
				if _, err := q.Enqueue(kibRequest(url, int(i), orders), queue.InOrder(fmt.Sprint(i%int64(orders)))); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
}
