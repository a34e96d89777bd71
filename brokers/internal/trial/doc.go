// Package trial holds the broker trials of the brokers module: N events
// published to NATS JetStream (in-process), Kafka (franz-go's kfake
// in-process, or IDEM_KAFKA_BROKERS) and RabbitMQ (IDEM_RABBITMQ_URL,
// started by scripts/servers/rabbitmq.sh), consumed through the brokers
// module's Consume* functions by consumer processes (package consumer)
// that are SIGKILLed at drawn points and restarted, until every event is
// settled; then a ledger must hold exactly one effect per event.
//
// It is a module of its own, never published, because it needs the
// PostgreSQL and Redis adapters and the chaos module's harness, which the
// brokers module must not require. Run it with
//
//	go test -run 'TestNATS|TestKafka|TestRabbitMQ' -v ./brokers/internal/trial/
//	BROKERS_MESSAGES=1000 CHAOS_TRIALS=5 go test -timeout 60m -v ./brokers/internal/trial/
package trial
