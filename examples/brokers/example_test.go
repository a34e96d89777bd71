package brokers_test

import (
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	goredis "github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/brokers"
	"github.com/exactlyonce/idempotency/inbox"
	"github.com/exactlyonce/idempotency/store/redis"
)

// What the producer of every example publishes: order-1 twice (a
// producer that retried: its first publish went through, but it never
// heard so), each with this payload.
var (
	published = []string{"order-1", "order-2", "order-1"}
	amount    = []byte(`{"amount":100}`)
)

// A billing consumer of a JetStream stream writes each order's row in its
// ledger table in the transaction that records the order in its inbox
// (postgres.InboxBatchTx, IDEM_POSTGRES_URL), and dies after the
// transaction of its first batch committed, before its acks reached
// JetStream. After the consumer's AckWait, JetStream delivers the orders
// again to the next instance on the same durable consumer: the inbox finds
// them recorded, they are acked, and the ledger has one row per order.
// A producer's retry of a publish (same Nats-Msg-Id, within the stream's
// duplicate window) is dropped by the stream itself. NATS runs in
// process.
func Example_nats() {
	ctx, stop := context.WithTimeout(context.Background(), time.Minute) // a stuck run fails, and does not hang
	defer stop()
	db, err := openLedger(ctx, "billing")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer db.close()
	dir, err := os.MkdirTemp("", "nats-example")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true})
	if err != nil {
		fmt.Println(err)
		return
	}
	ns.Start()
	defer ns.Shutdown()
	if !ns.ReadyForConnections(10 * time.Second) {
		fmt.Println("NATS is not ready")
		return
	}

	// The producer.
	pub, err := nats.Connect(ns.ClientURL())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pub.Close()
	js, err := jetstream.New(pub)
	if err != nil {
		fmt.Println(err)
		return
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}}); err != nil {
		fmt.Println(err)
		return
	}
	for _, id := range published {
		ack, err := js.Publish(ctx, "orders.placed", amount, jetstream.WithMsgID(id))
		if err != nil {
			fmt.Println(err)
			return
		}
		if ack.Duplicate {
			fmt.Printf("publish %s again: dropped by the stream\n", id)
		}
	}
	// The durable consumer, which outlives its instances: explicit acks,
	// unlimited deliveries, and an AckWait longer than a batch takes (short
	// here, for the example's sake).
	if _, err := js.CreateOrUpdateConsumer(ctx, "ORDERS", jetstream.ConsumerConfig{Durable: "billing",
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Second, MaxDeliver: -1}); err != nil {
		fmt.Println(err)
		return
	}

	var log notes
	// The first instance takes the two orders in one batch, commits them,
	// and dies: its connection closes before it acks.
	nc1, cons1, err := natsInstance(ctx, ns.ClientURL(), "ORDERS", "billing")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer nc1.Close()
	err = brokers.ConsumeNATS(ctx, cons1, crashAfter(db.handler(), nc1.Close),
		&brokers.Options{Batch: 2, MaxWait: 30 * time.Second, Settled: log.settled("1st instance", 2, nil)})
	fmt.Println("1st instance:", err)

	// The next instance gets them again once AckWait has passed.
	nc2, cons2, err := natsInstance(ctx, ns.ClientURL(), "ORDERS", "billing")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer nc2.Close()
	log.until(ctx, "2nd instance", 2, func(ctx context.Context, o *brokers.Options) error {
		return brokers.ConsumeNATS(ctx, cons2, db.handler(), o)
	})

	log.print()
	db.print(ctx)
	// Output:
	// publish order-1 again: dropped by the stream
	// 1st instance: brokers: NATS fetch: nats: connection closed
	// 1st instance order-1: ack, duplicate false, broker error nats: connection closed
	// 1st instance order-2: ack, duplicate false, broker error nats: connection closed
	// 2nd instance order-1: ack, duplicate true, broker error <nil>
	// 2nd instance order-2: ack, duplicate true, broker error <nil>
	// ledger: order-1, 1 row(s)
	// ledger: order-2, 1 row(s)
}

// A producer that retries without idempotence writes one order at two
// offsets, both with its ID in the ce_id header (brokers.KafkaIDHeader).
// The consumer's inbox is on Redis (IDEM_REDIS_ADDR) and its effect, a
// charge, is outside the store (brokers.Batch): it runs once per order.
// Kafka is franz-go's in-process kfake, or the cluster of
// IDEM_KAFKA_BROKERS (comma-separated addresses) when that is set.
func Example_kafka() {
	ctx, stop := context.WithTimeout(context.Background(), time.Minute) // a stuck run fails, and does not hang
	defer stop()
	addr, err := env("IDEM_REDIS_ADDR")
	if err != nil {
		fmt.Println(err)
		return
	}
	rdb := goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true})
	defer rdb.Close()
	prefix := unique("brokers-example") + ":"
	store, err := redis.New(rdb, &redis.Options{Prefix: prefix})
	if err != nil {
		fmt.Println(err)
		return
	}
	runner, err := idempotency.New(store)
	if err != nil {
		fmt.Println(err)
		return
	}
	in, err := inbox.New(runner, "billing")
	if err != nil {
		fmt.Println(err)
		return
	}
	charges := map[string]int{} // the payment gateway's charges, by order
	h, err := brokers.Batch(in, func(ctx context.Context, msg inbox.Message) error {
		charges[msg.ID]++
		return nil
	})
	if err != nil {
		fmt.Println(err)
		return
	}

	seeds, closeKafka, err := kafkaSeeds()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer closeKafka()
	admin, err := kgo.NewClient(kgo.SeedBrokers(seeds...))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer admin.Close()
	adm := kadm.NewClient(admin)
	topic, group := unique("orders"), unique("billing")
	if _, err := adm.CreateTopic(ctx, 1, 1, nil, topic); err != nil {
		fmt.Println(err)
		return
	}
	defer adm.DeleteTopics(context.Background(), topic)
	defer deleteKeys(rdb, store, in, prefix, topic, published)
	defer adm.DeleteGroups(context.Background(), group) // after the consumer has left it

	p, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.DefaultProduceTopic(topic))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer p.Close()
	for _, id := range published {
		r := &kgo.Record{Key: []byte(id), Value: amount, Headers: []kgo.RecordHeader{{Key: brokers.KafkaIDHeader, Value: []byte(id)}}}
		if err := p.ProduceSync(ctx, r).FirstErr(); err != nil {
			fmt.Println(err)
			return
		}
	}

	// A group member that commits what it handled, and only that.
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic),
		kgo.DisableAutoCommit(), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cl.Close()
	var log notes
	log.until(ctx, "consumer", 3, func(ctx context.Context, o *brokers.Options) error {
		return brokers.ConsumeKafka(ctx, cl, h, o)
	})

	log.print()
	for _, id := range slices.Sorted(maps.Keys(charges)) {
		fmt.Printf("charged %s %d time(s)\n", id, charges[id])
	}
	// Output:
	// consumer order-1: ack, duplicate false, broker error <nil>
	// consumer order-1: ack, duplicate true, broker error <nil>
	// consumer order-2: ack, duplicate false, broker error <nil>
	// charged order-1 1 time(s)
	// charged order-2 1 time(s)
}

// RabbitMQ (IDEM_RABBITMQ_URL) gets order-1 twice from a publisher that
// retried. The first instance of the billing consumer takes the three
// messages in one batch, writes each order's ledger row in the
// transaction that records it in the inbox (postgres.InboxBatchTx,
// IDEM_POSTGRES_URL; the retried order-1 is a duplicate within the
// batch), and dies after the commit, before its acks: RabbitMQ puts the
// unacknowledged messages back in the queue, the next instance gets them
// again and acks them as duplicates, and the ledger has one row per
// order.
func Example_rabbitMQ() {
	ctx, stop := context.WithTimeout(context.Background(), time.Minute) // a stuck run fails, and does not hang
	defer stop()
	conn, ch, err := dialRabbitMQ()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer conn.Close()
	db, err := openLedger(ctx, "billing")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer db.close()
	queue := unique("billing")
	if _, err := ch.QueueDeclare(queue, false, false, false, false, nil); err != nil {
		fmt.Println(err)
		return
	}
	defer ch.QueueDelete(queue, false, false, false)

	// The publisher, with confirms: a publish is done when RabbitMQ has it.
	if err := ch.Confirm(false); err != nil {
		fmt.Println(err)
		return
	}
	for _, id := range published {
		c, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, amqp.Publishing{MessageId: id, Body: amount})
		if err != nil {
			fmt.Println(err)
			return
		}
		if ok, err := c.WaitContext(ctx); !ok || err != nil {
			fmt.Println("publish not confirmed:", err)
			return
		}
	}

	var log notes
	// The first instance, on a connection of its own, takes the three
	// messages in one batch and dies after it.
	conn1, ch1, err := dialRabbitMQ()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer conn1.Close()
	err = brokers.ConsumeRabbitMQ(ctx, ch1, queue, crashAfter(db.handler(), func() { conn1.Close() }),
		&brokers.Options{Batch: 3, MaxWait: 30 * time.Second, Settled: log.settled("1st instance", 3, nil)})
	fmt.Println("1st instance:", err)

	// The next instance gets the unacknowledged messages again.
	conn2, ch2, err := dialRabbitMQ()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer conn2.Close()
	log.until(ctx, "2nd instance", 3, func(ctx context.Context, o *brokers.Options) error {
		return brokers.ConsumeRabbitMQ(ctx, ch2, queue, db.handler(), o)
	})

	log.print()
	db.print(ctx)
	// Output:
	// 1st instance: brokers: RabbitMQ: the channel closed
	// 1st instance order-1: ack, duplicate false, broker error Exception (504) Reason: "channel/connection is not open"
	// 1st instance order-1: ack, duplicate true, broker error Exception (504) Reason: "channel/connection is not open"
	// 1st instance order-2: ack, duplicate false, broker error Exception (504) Reason: "channel/connection is not open"
	// 2nd instance order-1: ack, duplicate true, broker error <nil>
	// 2nd instance order-1: ack, duplicate true, broker error <nil>
	// 2nd instance order-2: ack, duplicate true, broker error <nil>
	// ledger: order-1, 1 row(s)
	// ledger: order-2, 1 row(s)
}
