module github.com/exactlyonce/idempotency/queue

go 1.26.0

require (
	github.com/exactlyonce/idempotency v0.1.0
	go.etcd.io/bbolt v1.5.0
)

require (
	github.com/gowebpki/jcs v1.0.2 // indirect
	golang.org/x/sys v0.45.0 // indirect
)

