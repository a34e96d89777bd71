package queue_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/exactlyonce/idempotency/httpidem"
	"github.com/exactlyonce/idempotency/queue"
)

// benchDir is where the benchmarks' files go: on the disk the queue
// would use, not a tmpfs, where a flush costs nothing. QUEUE_BENCH_DIR
// names another.
func benchDir(b *testing.B) string {
	if d := os.Getenv("QUEUE_BENCH_DIR"); d != "" {
		dir, err := os.MkdirTemp(d, "queue-bench")
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { os.RemoveAll(dir) })
		return dir
	}
	return b.TempDir()
}

// A 1 KiB request: a JSON body of 1024 bytes and a few headers.
func kibRequest(b testing.TB, url string) *http.Request {
	body := `{"pad":"` + strings.Repeat("p", 1024-10) + `"}`
	req := post(b, url, body, "X-Till", "till-7", "Accept", "application/json")
	return req
}

// Enqueue of a 1 KiB request, each flushed (fsync) before it returns:
// alone (one flush per Enqueue), and from 16 goroutines (their Enqueues
// share flushes). Beside them the floor: the same write in a bbolt
// transaction of its own, and a bare write+fsync of the file.
func BenchmarkEnqueue(b *testing.B) {
	for _, c := range []struct {
		name string
		par  int
	}{{"serial", 1}, {"parallel-16", 16}} {
		b.Run(c.name, func(b *testing.B) {
			file := filepath.Join(benchDir(b), "q")
			q, err := queue.Open(file)
			if err != nil {
				b.Fatal(err)
			}
			defer q.Close()
			var wg sync.WaitGroup
			var next atomic.Int64
			b.ResetTimer()
			start := time.Now()
			for range c.par {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for next.Add(1) <= int64(b.N) {
						if _, err := q.Enqueue(kibRequest(b, "http://example.test/sales")); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			el := time.Since(start)
			b.StopTimer()
			b.ReportMetric(float64(b.N)/el.Seconds(), "enqueues/s")
			if st, err := os.Stat(file); err == nil {
				b.ReportMetric(float64(st.Size())/float64(b.N), "file-B/item")
			}
			if p, _, _ := q.Len(); p != b.N {
				b.Errorf("%d pending, want %d", p, b.N)
			}
		})
	}
	b.Run("floor-bbolt-put", func(b *testing.B) {
		db, err := bolt.Open(filepath.Join(benchDir(b), "floor"), 0o600, nil)
		if err != nil {
			b.Fatal(err)
		}
		defer db.Close()
		v := make([]byte, 1024+160) // the request and its record's framing
		b.ResetTimer()
		for range b.N {
			err := db.Update(func(tx *bolt.Tx) error {
				bk, err := tx.CreateBucketIfNotExists([]byte("items"))
				if err != nil {
					return err
				}
				id, _ := bk.NextSequence()
				var k [8]byte
				binary.BigEndian.PutUint64(k[:], id)
				return bk.Put(k[:], v)
			})
			if err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "enqueues/s")
	})
	b.Run("floor-write-fsync", func(b *testing.B) {
		f, err := os.Create(filepath.Join(benchDir(b), "floor"))
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		v := make([]byte, 1024+160)
		b.ResetTimer()
		for range b.N {
			if _, err := f.Write(v); err != nil {
				b.Fatal(err)
			}
			if err := f.Sync(); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "writes/s")
	})
}

// cpuTime is the process's CPU time so far: on a shared machine, the
// part of a wall time that was this process's work.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// Open of a queue of 10⁵ pending 1 KiB items (a file of about 170 MB),
// in wall time and in this process's CPU time.
func BenchmarkOpen(b *testing.B) {
	const n = 100_000
	file := filepath.Join(benchDir(b), "q")
	if err := queue.BulkLoad(file, n, 1, kibRequest(b, "http://example.test/sales")); err != nil {
		b.Fatal(err)
	}
	st, _ := os.Stat(file)
	var cpu time.Duration
	b.ResetTimer()
	for range b.N {
		c0 := cpuTime()
		q, err := queue.Open(file)
		if err != nil {
			b.Fatal(err)
		}
		cpu += cpuTime() - c0
		b.StopTimer()
		if p, _, _ := q.Len(); p != n {
			b.Fatalf("%d pending, want %d", p, n)
		}
		q.Close()
		b.StartTimer()
	}
	b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/open")
	b.ReportMetric(float64(cpu.Milliseconds())/float64(b.N), "cpu-ms/open")
	b.ReportMetric(n, "items")
	b.ReportMetric(float64(st.Size())/n, "file-B/item")
}

// Submitting a backlog to a local server (httpidem on the memory store,
// in this process: the fastest server there is), beside the same
// requests sent straight to it by a plain client, one at a time or four
// at once (four ordering keys): the queue's rate over the server's is the
// figure, in wall time and in this process's CPU time per item (the
// server's, the client's and, for the queue, its own), which a shared
// machine disturbs less. The backlog is b.N items.
func BenchmarkSubmit(b *testing.B) {
	for _, par := range []int{1, 4} {
		b.Run(fmt.Sprintf("server-alone/conc-%d", par), func(b *testing.B) {
			srv, _ := idemServer(b, created)
			tr := &http.Transport{MaxIdleConnsPerHost: par}
			defer tr.CloseIdleConnections()
			var next atomic.Int64
			var wg sync.WaitGroup
			b.ResetTimer()
			c0 := cpuTime()
			for range par {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for next.Add(1) <= int64(b.N) {
						req := kibRequest(b, srv)
						httpidem.SetKey(req, httpidem.NewKey())
						resp, err := tr.RoundTrip(req)
						if err != nil {
							b.Error(err)
							return
						}
						io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
						if resp.StatusCode != 201 {
							b.Errorf("status %d", resp.StatusCode)
							return
						}
					}
				}()
			}
			wg.Wait()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "items/s")
			b.ReportMetric(float64((cpuTime()-c0).Microseconds())/float64(b.N), "cpu-µs/item")
		})
		b.Run(fmt.Sprintf("queue/conc-%d", par), func(b *testing.B) {
			srv, l := idemServer(b, created)
			file := filepath.Join(benchDir(b), "q")
			if err := queue.BulkLoad(file, b.N, par, kibRequest(b, srv)); err != nil {
				b.Fatal(err)
			}
			tr := &http.Transport{MaxIdleConnsPerHost: par}
			defer tr.CloseIdleConnections()
			var done atomic.Int64
			q, err := queue.Open(file, queue.WithTransport(tr), queue.WithConcurrency(par),
				queue.WithOnDone(func(ctx context.Context, it *queue.Item) error {
					done.Add(1)
					return nil
				}))
			if err != nil {
				b.Fatal(err)
			}
			defer q.Close()
			ctx, cancel := context.WithCancel(context.Background())
			go func() {
				for done.Load() < int64(b.N) {
					time.Sleep(100 * time.Microsecond)
				}
				cancel()
			}()
			b.ResetTimer()
			c0 := cpuTime()
			q.Run(ctx)
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "items/s")
			b.ReportMetric(float64((cpuTime()-c0).Microseconds())/float64(b.N), "cpu-µs/item")
			if n := len(l.all()); n != b.N {
				b.Errorf("%d effects, want %d", n, b.N)
			}
			if p, _, _ := q.Len(); p != 0 {
				b.Errorf("%d pending after the run", p)
			}
		})
	}
}
