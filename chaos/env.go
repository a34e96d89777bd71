package chaos

import (
	"bytes"
	"context"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"
)

// What the trials of this module and of brokers/ share: the servers of the
// environment, the places a trial makes there and removes, and the stderr
// of the processes they kill.

// ServerEnv returns the environment variable that points the trials at a
// server (one address, a URL, or a comma-separated list of either),
// failing the test when it is unset (`make test` starts the servers) or
// names a host off loopback: the trials keep all their traffic on this
// machine.
func ServerEnv(t testing.TB, name string) string {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		t.Fatalf("%s is not set: the trials need the real server (`make test` starts one; or source the exports of scripts/servers/*.sh start DIR)", name)
	}
	for _, part := range strings.Split(v, ",") {
		host := part
		if u, err := url.Parse(part); err == nil && u.Host != "" {
			host = u.Host
		}
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
		if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
			t.Fatalf("%s=%q: the trials keep all traffic on loopback", name, v)
		}
	}
	return v
}

// Pool returns a pool of 3 connections to the PostgreSQL server at url,
// closed at the end of the test, after checking that the server answers.
func Pool(t testing.TB, url string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 3
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := pool.Ping(ctx); err != nil {
		t.Fatalf("PostgreSQL at %s: %v", url, err)
	}
	return pool
}

// DropTableLater drops table at the end of the test.
func DropTableLater(t testing.TB, pool *pgxpool.Pool, table string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, `DROP TABLE IF EXISTS `+pgx.Identifier{table}.Sanitize()); err != nil {
			t.Errorf("dropping %s: %v", table, err)
		}
	})
}

// DeleteRedisKeys deletes the keys that start with prefix (a trial's: they
// would expire after the retention anyway). Bounded: at most 1000 SCAN
// pages.
func DeleteRedisKeys(t testing.TB, rdb *goredis.Client, prefix string) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var cursor uint64
	for range 1000 {
		keys, next, err := rdb.Scan(ctx, cursor, prefix+"*", 1000).Result()
		if err != nil {
			t.Errorf("deleting the Redis keys of %s: %v", prefix, err)
			return
		}
		if len(keys) > 0 {
			if err := rdb.Unlink(ctx, keys...).Err(); err != nil {
				t.Errorf("deleting the Redis keys of %s: %v", prefix, err)
				return
			}
		}
		if cursor = next; cursor == 0 {
			return
		}
	}
}

// A Buffer keeps the first MiB written to it, for the stderr of a child
// process, to show when it dies on its own. It is safe for concurrent use.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write implements io.Writer; past the first MiB it drops p.
func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.b.Len() > 1<<20 {
		return len(p), nil
	}
	return s.b.Write(p)
}

// String returns what was kept.
func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
