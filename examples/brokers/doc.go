// Package brokers holds runnable examples of the brokers module's
// consumers on real stores, shaped as a service would run them: one
// example per broker, each with its own unique names (a PostgreSQL
// schema, a Redis key prefix, a topic and group, a queue), removed at
// the end, and each printing the same lines on every run.
//
//   - Example_nats: a JetStream durable consumer ([brokers.ConsumeNATS],
//     NATS in process) whose handler writes each order's row in a ledger
//     table in the transaction that records the order in the inbox
//     (postgres.InboxBatchTx on IDEM_POSTGRES_URL). Its first instance
//     dies after the commit, before its acks; after AckWait the next one
//     gets the orders again, acks them as duplicates, and the ledger has
//     one row per order. The stream drops a publish retried with the same
//     Nats-Msg-Id.
//   - Example_kafka: franz-go's in-process kfake (or IDEM_KAFKA_BROKERS),
//     a producer that writes one order twice with the same ce_id header
//     ([brokers.KafkaIDHeader]), and a group consumer
//     ([brokers.ConsumeKafka]) with its inbox on Redis (IDEM_REDIS_ADDR)
//     through [brokers.Batch]: the charge, an effect outside the store,
//     runs once per order.
//   - Example_rabbitMQ: a queue on IDEM_RABBITMQ_URL that gets one order
//     twice from a publisher that retried, consumed with
//     [brokers.ConsumeRabbitMQ] and postgres.InboxBatchTx as for NATS: the
//     duplicate publish is caught within the first batch, and the
//     deliveries that the first instance left unacknowledged when it died
//     are acked as duplicates by the next; one ledger row per order.
//
// The servers come from the variables that scripts/test.sh sets
// (scripts/servers starts them). Like every backend test of the
// repository, an example whose server is not given fails: it prints
// why, which is not its output. See README.md.
package brokers
