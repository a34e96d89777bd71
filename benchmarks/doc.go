// Package benchmarks compares the backends of
// github.com/exactlyonce/idempotency side by side: the same workloads
// through idempotency.Do on the memory store, PostgreSQL, a single Redis and
// a Redis Cluster, named so that benchstat can put them in columns.
//
//	go test -run '^$' -bench . ./benchmarks/
//	go run ./benchmarks/cmd/report
//
// The servers come from IDEM_POSTGRES_URL, IDEM_REDIS_ADDR and
// IDEM_REDIS_CLUSTER_ADDRS (scripts/test.sh starts them; so do
// scripts/servers/*.sh start DIR). A backend whose variable is unset fails;
// it is never skipped, except MongoDB when scripts/servers/mongo.sh said no
// server could be had (IDEM_MONGO_ABSENT; scripts/test.sh then says so
// loudly). See README.md for the figures of one run.
package benchmarks
