module github.com/exactlyonce/idempotency/chaos

go 1.26.0

require github.com/exactlyonce/idempotency v0.1.0
