package brokers_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/brokers"
	"github.com/exactlyonce/idempotency/inbox"
)

// TestRefusedConfiguration: every configuration that could hang, lose a
// message or run an effect twice is refused before anything is consumed,
// with an error that names what is wrong and wraps ErrInvalidArgument.
func TestRefusedConfiguration(t *testing.T) {
	ctx := context.Background()
	h := billing()
	group, err := kgo.NewClient(kgo.SeedBrokers("127.0.0.1:1"), kgo.ConsumerGroup("g"), kgo.ConsumeTopics("t"))
	if err != nil {
		t.Fatal(err)
	}
	defer group.Close()
	plain, err := kgo.NewClient(kgo.SeedBrokers("127.0.0.1:1"), kgo.ConsumeTopics("t"))
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	cases := []struct {
		name, want string
		run        func() error
	}{
		{"negative Batch", "Options.Batch", func() error {
			return brokers.ConsumeNATS(ctx, nil, h, &brokers.Options{Batch: -1})
		}},
		{"negative MaxWait", "Options.MaxWait", func() error {
			return brokers.ConsumeKafka(ctx, group, h, &brokers.Options{MaxWait: -1})
		}},
		{"negative RetryDelay", "Options.RetryDelay", func() error {
			return brokers.ConsumeRabbitMQ(ctx, nil, "q", h, &brokers.Options{RetryDelay: -1})
		}},
		{"nil NATS consumer", "nil consumer", func() error { return brokers.ConsumeNATS(ctx, nil, h, nil) }},
		{"nil Kafka client", "nil client", func() error { return brokers.ConsumeKafka(ctx, nil, h, nil) }},
		{"nil RabbitMQ channel", "nil channel", func() error { return brokers.ConsumeRabbitMQ(ctx, nil, "q", h, nil) }},
		{"RabbitMQ without a queue", "empty queue name", func() error { return brokers.ConsumeRabbitMQ(ctx, &amqp.Channel{}, "", h, nil) }},
		{"nil handler", "nil handler", func() error { return brokers.ConsumeKafka(ctx, group, nil, nil) }},
		{"Kafka autocommit", "kgo.DisableAutoCommit", func() error { return brokers.ConsumeKafka(ctx, group, h, nil) }},
		{"Kafka without a group", "kgo.ConsumerGroup", func() error { return brokers.ConsumeKafka(ctx, plain, h, nil) }},
		{"Batch without an inbox", "nil inbox", func() error {
			_, err := brokers.Batch(nil, func(context.Context, inbox.Message) error { return nil })
			return err
		}},
		{"Batch without a handler", "nil handler", func() error {
			_, err := brokers.Batch(&inbox.Inbox{}, nil)
			return err
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.run()
			if !errors.Is(err, idempotency.ErrInvalidArgument) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v; want an ErrInvalidArgument naming %q", err, c.want)
			}
		})
	}
}
