package trial_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// natsAckWait is the trials' AckWait: shorter than a slow handling
// (trialSlow), so that JetStream redelivers those events to the other
// consumer while the first still handles them, and so redelivers a killed
// consumer's events soon.
const natsAckWait = time.Second

// startNATS runs a JetStream server in the test process, on a free
// loopback port, with its store in a temporary directory; it stops at the
// end of the test.
func startNATS(t testing.TB) string {
	t.Helper()
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true,
		StoreDir: t.TempDir(), NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("the NATS server is not ready after 10s")
	}
	return ns.ClientURL()
}

type natsEnv struct {
	url  string
	js   jetstream.JetStream
	cons jetstream.Consumer
}

func (e *natsEnv) name() string  { return "NATS JetStream (nats-server v2.15.2, in-process)" }
func (e *natsEnv) stopped() bool { return false }

func (e *natsEnv) prepare(t *testing.T, trial string, msgs []testMsg) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := e.js.CreateStream(ctx, jetstream.StreamConfig{Name: trial, Subjects: []string{trial + ".>"}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.js.DeleteStream(context.Background(), trial) })
	var err error
	e.cons, err = e.js.CreateOrUpdateConsumer(ctx, trial, jetstream.ConsumerConfig{Durable: "trial",
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: natsAckWait, MaxDeliver: -1, MaxAckPending: 10000})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs {
		if _, err := e.js.Publish(ctx, trial+".events", m.payload, jetstream.WithMsgID(m.id)); err != nil {
			t.Fatal(err)
		}
	}
	return []string{"-broker", "nats", "-url", e.url, "-name", trial, "-group", "trial"}
}

func (e *natsEnv) drained(t *testing.T) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	info, err := e.cons.Info(ctx)
	if err != nil {
		t.Fatalf("consumer info: %v", err)
	}
	return info.NumPending == 0 && info.NumAckPending == 0
}

// TestNATS runs the trials on JetStream: two consumer processes pull from
// one durable consumer; slow handlings outlive the AckWait (JetStream
// redelivers them to the other consumer while the first still handles
// them), transient failures are negatively acknowledged with a delay, and
// killed consumers' deliveries come back after the AckWait.
func TestNATS(t *testing.T) {
	url := startNATS(t)
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	runModes(t, &natsEnv{url: url, js: js})
}
