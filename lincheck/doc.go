// Package lincheck checks that the stores of github.com/exactlyonce/idempotency
// are linearizable with respect to the Store contract, using the porcupine
// checker (github.com/anishathalye/porcupine).
//
// The package has no exported API: everything lives in its tests. They run
// many goroutines against a handful of keys of a real store (store/memory
// in process, store/postgres at IDEM_POSTGRES_URL, store/redis at
// IDEM_REDIS_ADDR and on the Redis Cluster at IDEM_REDIS_CLUSTER_ADDRS,
// store/etcd at IDEM_ETCD_ENDPOINTS and on an embedded etcd 3.6, store/mongo
// at IDEM_MONGO_URI),
// record when every operation was called and when it returned, and ask
// porcupine whether some order of the operations, each taking effect at one
// instant between its call and its return, explains every observed output
// under a sequential model of the contract. The tests also run the same
// check against deliberately broken stores, to show that it catches a
// claim decided by a read and then a write, a Complete that ignores the
// holder's token and a fence that does not grow across re-creation.
//
// Run them with scripts/test.sh, which starts the servers, or set the
// variables yourself.
package lincheck
