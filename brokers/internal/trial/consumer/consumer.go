// Package consumer is the process the broker trials run, kill and restart:
// it consumes one broker with the brokers module's Consume* functions and
// an inbox on a real store, and its effect is one row per handling of an
// event in a PostgreSQL ledger with no unique constraint, so that the
// trials can count every event's effects.
//
// It is a test fixture, not an example to copy (see the brokers module's
// examples). The trials run it as their own
// test binary, re-executed with [EnvVar] set, whose TestMain calls [Main]:
// its flags carry what the trials vary, and it tells the harness on stdout
// what it does, one line each:
//
//	READY                  connected; consuming
//	BATCH id,id,...        a batch handed to the inbox (a delivery each)
//	SETTLED id disp dup    the broker was told disp (ack, retry,
//	                       dead-letter) for id; dup is 1 for a duplicate
//	DEAD id                id is being dead-lettered
//	ASSIGNED / REVOKED     Kafka: the group gave or took partitions
//	PHASE name             at -pause-at: it waits for a line on stdin
//	                       ("go"), or to be killed
//
// The phases: "polled" (a batch arrived, nothing claimed), "first-effect"
// (the batch's events are claimed, before its first effect), "effect"
// (after an effect: committed in -mode batch, inside the transaction in
// -mode tx), "handled" (the batch is recorded, nothing told to the broker)
// and "settled" (after telling the broker one message's disposition).
// -pause-at names one and the occurrence (counting from 0) at which to
// stop, e.g. "effect:12".
package consumer

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"math/rand/v2"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	goredis "github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/brokers"
	"github.com/exactlyonce/idempotency/inbox"
	"github.com/exactlyonce/idempotency/store/postgres"
	"github.com/exactlyonce/idempotency/store/redis"
)

type config struct {
	broker, url, name, group, instance string
	mode, store, pgURL, redisAddr      string
	table, prefix, ledger              string
	batch                              int
	lease, retryDelay, slow            time.Duration
	failRate                           float64
	poisonEvery, slowEvery             int
	pauseAt                            string
}

// EnvVar, set to 1 in a test binary's environment, makes its TestMain run
// Main instead of the tests.
const EnvVar = "IDEM_BROKERS_CONSUMER"

// Main runs the consumer with the command-line arguments args (without the
// program's name) until SIGTERM, and returns the process's exit code.
func Main(args []string) int {
	log.SetFlags(log.Lmicroseconds)
	log.SetPrefix("consumer: ")
	var c config
	flag := flag.NewFlagSet("consumer", flag.ContinueOnError)
	flag.StringVar(&c.broker, "broker", "", "nats, kafka or rabbitmq")
	flag.StringVar(&c.url, "url", "", "the broker: a NATS URL, Kafka seed brokers (comma-separated), an AMQP URL")
	flag.StringVar(&c.name, "name", "", "the stream (NATS), topic (Kafka) or queue (RabbitMQ)")
	flag.StringVar(&c.group, "group", "", "the durable consumer (NATS) or consumer group (Kafka)")
	flag.StringVar(&c.instance, "instance", "", "Kafka: the static group member's instance ID")
	flag.StringVar(&c.mode, "mode", "batch", "batch (brokers.Batch: inbox.HandleBatch) or tx (postgres.InboxBatchTx: one transaction per batch)")
	flag.StringVar(&c.store, "store", "postgres", "the inbox's store: postgres or redis")
	flag.StringVar(&c.pgURL, "postgres", "", "PostgreSQL URL: the ledger, and the store with -store postgres")
	flag.StringVar(&c.redisAddr, "redis", "", "Redis address, with -store redis")
	flag.StringVar(&c.table, "table", "", "the PostgreSQL store's table (migrated by the harness)")
	flag.StringVar(&c.prefix, "prefix", "", "the Redis store's key prefix")
	flag.StringVar(&c.ledger, "ledger", "", "the ledger table: one row per effect")
	flag.IntVar(&c.batch, "batch", 50, "the most messages per batch")
	flag.DurationVar(&c.lease, "lease", time.Second, "the inbox runner's lease")
	flag.DurationVar(&c.retryDelay, "retry-delay", 200*time.Millisecond, "brokers.Options.RetryDelay")
	flag.Float64Var(&c.failRate, "fail-rate", 0, "the share of handlings that fail with a transient error before their effect")
	flag.IntVar(&c.poisonEvery, "poison-every", 0, "events whose number is a multiple of this fail permanently (no effect; dead-lettered)")
	flag.IntVar(&c.slowEvery, "slow-every", 0, "events whose number is 1 modulo this take -slow to handle")
	flag.DurationVar(&c.slow, "slow", 0, "see -slow-every")
	flag.StringVar(&c.pauseAt, "pause-at", "", "phase:occurrence at which to announce PHASE and wait")
	if err := flag.Parse(args); err != nil {
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := run(ctx, c); err != nil && !errors.Is(err, context.Canceled) {
		log.Print(err)
		return 1
	}
	return 0
}

// out writes the harness's lines, one at a time.
var out = struct {
	sync.Mutex
	w *bufio.Writer
}{w: bufio.NewWriter(os.Stdout)}

func say(format string, args ...any) {
	out.Lock()
	defer out.Unlock()
	fmt.Fprintf(out.w, format+"\n", args...)
	out.w.Flush()
}

// pauser stops the process at -pause-at.
type pauser struct {
	mu     sync.Mutex
	phase  string
	at     int
	counts map[string]int
	in     *bufio.Reader
}

func newPauser(spec string) (*pauser, error) {
	p := &pauser{counts: make(map[string]int), in: bufio.NewReader(os.Stdin)}
	if spec == "" {
		return p, nil
	}
	name, n, ok := strings.Cut(spec, ":")
	at, err := strconv.Atoi(n)
	if !ok || err != nil || at < 0 {
		return nil, fmt.Errorf("-pause-at %q: want phase:occurrence", spec)
	}
	p.phase, p.at = name, at
	return p, nil
}

// reached counts an occurrence of phase; at the planned one it announces
// it and waits for the harness's go-ahead (or its SIGKILL).
func (p *pauser) reached(phase string) {
	p.mu.Lock()
	n := p.counts[phase]
	p.counts[phase] = n + 1
	p.mu.Unlock()
	if phase != p.phase || n != p.at {
		return
	}
	say("PHASE %s", phase)
	if _, err := p.in.ReadString('\n'); err != nil {
		select {} // no go-ahead will come: wait for the kill
	}
}

// execer is a pool or a transaction.
type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

var errTransient = errors.New("consumer: a transient failure (drawn)")

func run(ctx context.Context, c config) error {
	if c.pgURL == "" || c.ledger == "" {
		return errors.New("-postgres and -ledger are required")
	}
	p, err := newPauser(c.pauseAt)
	if err != nil {
		return err
	}
	pcfg, err := pgxpool.ParseConfig(c.pgURL)
	if err != nil {
		return err
	}
	pcfg.MaxConns = 4 // the server is shared: keep the pool small
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return err
	}
	defer pool.Close()

	var store idempotency.Store
	switch c.store {
	case "postgres":
		if store, err = postgres.New(pool, &postgres.Options{Table: c.table}); err != nil {
			return err
		}
	case "redis":
		client := goredis.NewClient(&goredis.Options{Addr: c.redisAddr, PoolSize: 4})
		defer client.Close()
		if store, err = redis.New(client, &redis.Options{Prefix: c.prefix}); err != nil {
			return err
		}
	default:
		return fmt.Errorf("-store %q: want postgres or redis", c.store)
	}
	runner, err := idempotency.New(store, idempotency.WithUnsafeShortDurations(), idempotency.WithLease(c.lease),
		idempotency.WithRetention(30*time.Minute), idempotency.WithStoreTimeout(c.lease/3))
	if err != nil {
		return err
	}
	in, err := inbox.New(runner, "trial")
	if err != nil {
		return err
	}

	ledger := pgx.Identifier{c.ledger}.Sanitize()
	pid := os.Getpid()
	var started atomic.Bool // the batch's first handling began
	effect := func(ctx context.Context, db execer, msg inbox.Message) error {
		if !started.Swap(true) {
			p.reached("first-effect")
		}
		n, err := strconv.Atoi(strings.TrimPrefix(msg.ID, "m-"))
		if err != nil {
			return idempotency.Permanent(fmt.Errorf("consumer: event ID %q is not m-N", msg.ID))
		}
		if c.poisonEvery > 0 && n%c.poisonEvery == 0 {
			return idempotency.Permanent(fmt.Errorf("consumer: event %s is poison", msg.ID))
		}
		if c.failRate > 0 && rand.Float64() < c.failRate {
			return errTransient
		}
		if c.slowEvery > 0 && n%c.slowEvery == 1 {
			time.Sleep(c.slow)
		}
		info, _ := idempotency.FromContext(ctx)
		if _, err := db.Exec(ctx, `INSERT INTO `+ledger+` (msg_id, fence, pid) VALUES ($1, $2, $3)`, msg.ID, info.Fence, pid); err != nil {
			return err
		}
		p.reached("effect")
		return nil
	}
	var inner brokers.BatchHandler
	switch c.mode {
	case "batch":
		inner, err = brokers.Batch(in, func(ctx context.Context, msg inbox.Message) error { return effect(ctx, pool, msg) })
	case "tx":
		inner = func(ctx context.Context, msgs []inbox.Message) []inbox.Delivery {
			return postgres.InboxBatchTx(ctx, in, pool, msgs, func(ctx context.Context, tx pgx.Tx, i int) error { return effect(ctx, tx, msgs[i]) })
		}
	default:
		err = fmt.Errorf("-mode %q: want batch or tx", c.mode)
	}
	if err != nil {
		return err
	}
	h := func(ctx context.Context, msgs []inbox.Message) []inbox.Delivery {
		ids := make([]string, len(msgs))
		for i, m := range msgs {
			ids[i] = m.ID
		}
		say("BATCH %s", strings.Join(ids, ","))
		p.reached("polled")
		started.Store(false)
		ds := inner(ctx, msgs)
		p.reached("handled")
		return ds
	}
	opts := &brokers.Options{
		Batch:      c.batch,
		RetryDelay: c.retryDelay,
		DeadLetter: func(_ context.Context, msg inbox.Message, _ inbox.Delivery) error {
			say("DEAD %s", msg.ID)
			return nil
		},
		Settled: func(msg inbox.Message, d inbox.Delivery, err error) {
			dup := 0
			if d.Duplicate {
				dup = 1
			}
			if err != nil {
				log.Printf("telling the broker %v for %s: %v", d.Disposition, msg.ID, err)
			}
			say("SETTLED %s %v %d", msg.ID, d.Disposition, dup)
			p.reached("settled")
		},
	}

	switch c.broker {
	case "nats":
		nc, err := nats.Connect(c.url, nats.MaxReconnects(-1))
		if err != nil {
			return err
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			return err
		}
		cons, err := js.Consumer(ctx, c.name, c.group)
		if err != nil {
			return err
		}
		say("READY")
		return brokers.ConsumeNATS(ctx, cons, h, opts)
	case "kafka":
		copts := []kgo.Opt{
			kgo.SeedBrokers(strings.Split(c.url, ",")...),
			kgo.ConsumerGroup(c.group),
			kgo.ConsumeTopics(c.name),
			kgo.DisableAutoCommit(),
			kgo.SessionTimeout(6 * time.Second),
			kgo.HeartbeatInterval(300 * time.Millisecond),
			kgo.FetchMaxWait(200 * time.Millisecond),
			kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, m map[string][]int32) {
				say("ASSIGNED %v", m[c.name])
			}),
			kgo.OnPartitionsRevoked(func(_ context.Context, _ *kgo.Client, m map[string][]int32) {
				say("REVOKED %v", m[c.name])
			}),
		}
		if c.instance != "" {
			// A static member: restarted after a kill, it gets its
			// partitions back at once instead of after the session
			// timeout.
			copts = append(copts, kgo.InstanceID(c.instance))
		}
		cl, err := kgo.NewClient(copts...)
		if err != nil {
			return err
		}
		defer cl.Close()
		say("READY")
		return brokers.ConsumeKafka(ctx, cl, h, opts)
	case "rabbitmq":
		conn, err := amqp.Dial(c.url)
		if err != nil {
			return err
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			return err
		}
		say("READY")
		return brokers.ConsumeRabbitMQ(ctx, ch, c.name, h, opts)
	}
	return fmt.Errorf("-broker %q: want nats, kafka or rabbitmq", c.broker)
}
