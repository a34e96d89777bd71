package integration

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/exactlyonce/idempotency/store/redis"
)

func TestRedis(t *testing.T) {
	addr := os.Getenv("IDEM_REDIS_ADDR")
	if addr == "" {
		t.Fatal("IDEM_REDIS_ADDR is not set: run scripts/test.sh (it starts a throwaway Redis) or set IDEM_REDIS_ADDR=host:port")
	}
	client := goredis.NewClient(&goredis.Options{Addr: addr})
	defer client.Close()
	if err := client.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("cannot reach the Redis at IDEM_REDIS_ADDR=%s (%v); run scripts/test.sh or point it at a reachable server", addr, err)
	}
	store, err := redis.New(client, &redis.Options{Prefix: fmt.Sprintf("httpidem-it-%d:", time.Now().UnixNano()), Notify: true})
	if err != nil {
		t.Fatal(err)
	}
	scenario(t, store)
}
