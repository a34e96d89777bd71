package brokers_test

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/brokers"
	"github.com/exactlyonce/idempotency/inbox"
	"github.com/exactlyonce/idempotency/store/memory"
)

// billing returns the batch handler of the examples: an inbox on a memory
// store (use a real one: PostgreSQL, Redis, ...; examples/brokers runs
// each loop on one) whose effect prints the event.
func billing() brokers.BatchHandler {
	s, err := memory.New(nil)
	if err != nil {
		panic(err)
	}
	r, err := idempotency.New(s)
	if err != nil {
		panic(err)
	}
	in, err := inbox.New(r, "billing")
	if err != nil {
		panic(err)
	}
	h, err := brokers.Batch(in, func(ctx context.Context, msg inbox.Message) error {
		fmt.Printf("charged %s\n", msg.ID)
		return nil
	})
	if err != nil {
		panic(err)
	}
	return h
}

// stopAfter returns Options whose Settled hook prints each message's
// disposition and cancels the consumer after n messages.
func stopAfter(n int, cancel context.CancelFunc) *brokers.Options {
	var settled atomic.Int32
	return &brokers.Options{MaxWait: 200 * time.Millisecond, Settled: func(msg inbox.Message, d inbox.Delivery, err error) {
		fmt.Printf("%s: %s, duplicate %v, broker error %v\n", msg.ID, d.Disposition, d.Duplicate, err)
		if int(settled.Add(1)) == n {
			cancel()
		}
	}}
}

// A JetStream stream drops a publish whose Nats-Msg-Id it has seen within
// its duplicate window; the inbox catches what comes after: here the
// durable consumer is recreated and delivers the stream again.
func ExampleConsumeNATS() {
	dir, _ := os.MkdirTemp("", "nats-example")
	defer os.RemoveAll(dir)
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true})
	if err != nil {
		panic(err)
	}
	ns.Start()
	defer ns.Shutdown()
	if !ns.ReadyForConnections(10 * time.Second) {
		panic("NATS is not ready")
	}
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		panic(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}}); err != nil {
		panic(err)
	}
	for _, id := range []string{"order-1", "order-2"} {
		if _, err := js.Publish(ctx, "orders.placed", []byte(`{"amount":100}`), jetstream.WithMsgID(id)); err != nil {
			panic(err)
		}
	}
	h := billing()
	for range 2 { // the second time: a consumer reset
		_ = js.DeleteConsumer(ctx, "ORDERS", "billing")
		cons, err := js.CreateOrUpdateConsumer(ctx, "ORDERS", jetstream.ConsumerConfig{Durable: "billing",
			AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second, MaxDeliver: -1})
		if err != nil {
			panic(err)
		}
		cctx, cancel := context.WithCancel(ctx)
		_ = brokers.ConsumeNATS(cctx, cons, h, stopAfter(2, cancel))
		cancel()
	}
	// Output:
	// charged order-1
	// charged order-2
	// order-1: ack, duplicate false, broker error <nil>
	// order-2: ack, duplicate false, broker error <nil>
	// order-1: ack, duplicate true, broker error <nil>
	// order-2: ack, duplicate true, broker error <nil>
}

// A producer that retries without idempotence writes one event at two
// offsets: both carry its ID in the ce_id header, and its effect runs
// once. Without a broker address this runs against franz-go's in-process
// Kafka (kfake).
func ExampleConsumeKafka() {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders"))
	if err != nil {
		panic(err)
	}
	defer c.Close()
	ctx := context.Background()
	p, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.DefaultProduceTopic("orders"))
	if err != nil {
		panic(err)
	}
	defer p.Close()
	for _, id := range []string{"order-1", "order-2", "order-1"} {
		r := &kgo.Record{Value: []byte(`{"amount":100}`), Headers: []kgo.RecordHeader{{Key: brokers.KafkaIDHeader, Value: []byte(id)}}}
		if err := p.ProduceSync(ctx, r).FirstErr(); err != nil {
			panic(err)
		}
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumerGroup("billing"), kgo.ConsumeTopics("orders"),
		kgo.DisableAutoCommit(), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		panic(err)
	}
	defer cl.Close()
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	_ = brokers.ConsumeKafka(cctx, cl, billing(), stopAfter(3, cancel))
	// Output:
	// charged order-1
	// charged order-2
	// order-1: ack, duplicate false, broker error <nil>
	// order-2: ack, duplicate false, broker error <nil>
	// order-1: ack, duplicate true, broker error <nil>
}

// RabbitMQ delivers again what a consumer left unacknowledged, and a
// publisher that retries publishes twice: the message-id property names the
// event. It needs a RabbitMQ server: IDEM_RABBITMQ_URL (the repository's
// test script starts one with scripts/servers/rabbitmq.sh).
func ExampleConsumeRabbitMQ() {
	conn, err := amqp.Dial(os.Getenv("IDEM_RABBITMQ_URL"))
	if err != nil {
		fmt.Println("IDEM_RABBITMQ_URL:", err)
		return
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		panic(err)
	}
	q, err := ch.QueueDeclare("", false, true, true, false, nil) // a queue of this example's own
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	for _, id := range []string{"order-1", "order-2", "order-1"} {
		if err := ch.PublishWithContext(ctx, "", q.Name, true, false, amqp.Publishing{MessageId: id, Body: []byte(`{"amount":100}`)}); err != nil {
			panic(err)
		}
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cch, err := conn.Channel()
	if err != nil {
		panic(err)
	}
	_ = brokers.ConsumeRabbitMQ(cctx, cch, q.Name, billing(), stopAfter(3, cancel))
	// Output:
	// charged order-1
	// charged order-2
	// order-1: ack, duplicate false, broker error <nil>
	// order-2: ack, duplicate false, broker error <nil>
	// order-1: ack, duplicate true, broker error <nil>
}
