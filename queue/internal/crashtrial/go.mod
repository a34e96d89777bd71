module github.com/exactlyonce/idempotency/queue/internal/crashtrial

go 1.26.0

require (
	github.com/exactlyonce/idempotency v0.1.0
	github.com/exactlyonce/idempotency/queue v0.1.0
	github.com/exactlyonce/idempotency/store/postgres v0.1.0
	github.com/exactlyonce/idempotency/store/redis v0.1.0
	github.com/jackc/pgx/v5 v5.12.0
	github.com/redis/go-redis/v9 v9.23.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/gowebpki/jcs v1.0.2 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	go.etcd.io/bbolt v1.5.0 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sync v0.22.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
	golang.org/x/text v0.41.0 // indirect
)

// This module is never tagged or published: it is the queue's crash
// trial, which needs the PostgreSQL and Redis adapters that the queue
// itself must not require. The replaces build it against this checkout
// also with GOWORK=off.
replace (
	github.com/exactlyonce/idempotency => ../../../
	github.com/exactlyonce/idempotency/queue => ../../
	github.com/exactlyonce/idempotency/store/postgres => ../../../store/postgres
	github.com/exactlyonce/idempotency/store/redis => ../../../store/redis
)
