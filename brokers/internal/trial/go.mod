module github.com/exactlyonce/idempotency/brokers/internal/trial

go 1.26.0

// This module is never tagged or published: it is the broker trials,
// which need the PostgreSQL and Redis adapters and the chaos harness that
// the brokers module itself must not require. The replaces build it
// against this checkout also with GOWORK=off.
replace (
	github.com/exactlyonce/idempotency => ../../../
	github.com/exactlyonce/idempotency/brokers => ../../
	github.com/exactlyonce/idempotency/chaos => ../../../chaos
	github.com/exactlyonce/idempotency/internal/etcdtest => ../../../internal/etcdtest
	github.com/exactlyonce/idempotency/mcpidem => ../../../mcpidem
	github.com/exactlyonce/idempotency/store/etcd => ../../../store/etcd
	github.com/exactlyonce/idempotency/store/postgres => ../../../store/postgres
	github.com/exactlyonce/idempotency/store/redis => ../../../store/redis
)

require (
	github.com/exactlyonce/idempotency v0.1.0
	github.com/exactlyonce/idempotency/brokers v0.1.0
	github.com/exactlyonce/idempotency/chaos v0.1.0
	github.com/exactlyonce/idempotency/store/postgres v0.1.0
	github.com/exactlyonce/idempotency/store/redis v0.1.0
	github.com/jackc/pgx/v5 v5.12.0
	github.com/nats-io/nats-server/v2 v2.15.2
	github.com/nats-io/nats.go v1.55.0
	github.com/rabbitmq/amqp091-go v1.16.0
	github.com/redis/go-redis/v9 v9.23.0
	github.com/twmb/franz-go v1.22.3
	github.com/twmb/franz-go/pkg/kadm v1.20.0
	github.com/twmb/franz-go/pkg/kfake v0.0.0-20260918054303-01f206a7e32c
)

require (
	github.com/antithesishq/antithesis-sdk-go v0.9.0-default-no-op // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/google/go-tpm v0.9.8 // indirect
	github.com/gowebpki/jcs v1.0.2 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	github.com/klauspost/compress v1.20.4 // indirect
	github.com/mattn/go-colorable v0.1.15 // indirect
	github.com/mattn/go-isatty v0.0.22 // indirect
	github.com/minio/highwayhash v1.0.4 // indirect
	github.com/nats-io/jwt/v2 v2.8.3 // indirect
	github.com/nats-io/nkeys v0.4.17 // indirect
	github.com/nats-io/nuid v1.0.1 // indirect
	github.com/pierrec/lz4/v4 v4.1.33 // indirect
	github.com/prometheus/client_golang v1.24.1 // indirect
	github.com/prometheus/client_model v0.6.3 // indirect
	github.com/prometheus/common v0.72.0 // indirect
	github.com/prometheus/procfs v0.22.0 // indirect
	github.com/twmb/franz-go/pkg/kmsg v1.15.1 // indirect
	go.opentelemetry.io/otel v1.47.0 // indirect
	go.opentelemetry.io/otel/sdk v1.47.0 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/crypto v0.58.0 // indirect
	golang.org/x/oauth2 v0.37.0 // indirect
	golang.org/x/sync v0.24.0 // indirect
	golang.org/x/sys v0.50.0 // indirect
	golang.org/x/text v0.43.0 // indirect
	golang.org/x/time v0.16.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20261110000943-09e21b237f2c // indirect
	google.golang.org/grpc v1.85.0 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)
