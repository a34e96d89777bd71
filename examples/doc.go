// Package examples holds runnable examples of the httpidem middleware with
// web frameworks (chi, gin, echo), its integration tests on the
// PostgreSQL and Redis stores, a reconciler on each of the five stores
// (package reconcile), and a consumer for each broker of the brokers
// module on a real store (package brokers: NATS JetStream and RabbitMQ
// with postgres.InboxBatchTx, Kafka with an inbox on Redis). It is a
// module of its own, so the root module never depends on a framework, a
// driver or a broker client.
package examples
