package trial_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/exactlyonce/idempotency/chaos"
)

// rabbitFailRate is the share of handlings that fail transiently in the
// RabbitMQ trials: each is requeued and delivered again at once, the
// requeue storm (on top of the deliveries a killed consumer held, which
// come back in progress while its leases run, and are requeued too).
const rabbitFailRate = 0.3

type rabbitEnv struct {
	url, queue, version string
	ch                  *amqp.Channel
}

func (e *rabbitEnv) name() string  { return "RabbitMQ " + e.version }
func (e *rabbitEnv) stopped() bool { return true }

func (e *rabbitEnv) prepare(t *testing.T, trial string, msgs []testMsg) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e.queue = trial
	if _, err := e.ch.QueueDeclare(trial, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.ch.QueueDelete(trial, false, false, false) })
	if err := e.ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs {
		c, err := e.ch.PublishWithDeferredConfirmWithContext(ctx, "", trial, true, false, amqp.Publishing{
			MessageId: m.id, Body: m.payload, DeliveryMode: amqp.Persistent, ContentType: "application/octet-stream"})
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := c.WaitContext(ctx); err != nil || !ok {
			t.Fatalf("publishing %s: confirmed %v, %v", m.id, ok, err)
		}
	}
	return []string{"-broker", "rabbitmq", "-url", e.url, "-name", trial, "-fail-rate", fmt.Sprint(rabbitFailRate)}
}

// drained, with the consumers stopped: nothing is ready in the queue (the
// deliveries they held unacknowledged are back there by now).
func (e *rabbitEnv) drained(t *testing.T) bool {
	t.Helper()
	q, err := e.ch.QueueDeclarePassive(e.queue, true, false, false, false, nil)
	if err != nil {
		t.Fatalf("queue %s: %v", e.queue, err)
	}
	return q.Messages == 0
}

// TestRabbitMQ runs the trials on RabbitMQ (IDEM_RABBITMQ_URL; `make test`
// starts Debian's server with scripts/servers/rabbitmq.sh): two consumers on
// one queue, a third of the handlings failing transiently and requeued at
// once, a requeue storm, and killed consumers' unacknowledged deliveries
// requeued by the broker.
func TestRabbitMQ(t *testing.T) {
	url := chaos.ServerEnv(t, "IDEM_RABBITMQ_URL")
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatalf("IDEM_RABBITMQ_URL: %v", err)
	}
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	version, _ := conn.Properties["version"].(string) // the server's, from connection.start
	runModes(t, &rabbitEnv{url: url, ch: ch, version: version})
}
