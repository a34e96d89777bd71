// Command paysvc is the payments service that the process-kill trials of
// package chaos run as a child process and SIGKILL: POST /pay behind the
// httpidem middleware (or, with -edge mcp, an MCP charge tool behind the
// mcpidem middleware, served over streamable HTTP at /mcp), on PostgreSQL
// or Redis, charging a "gateway" whose charges are rows of a PostgreSQL
// ledger table, so that the harness can count them.
//
// Modes (-mode):
//
//   - pg-do: idempotency.Do on the PostgreSQL store. The charge is the
//     README's recipe for effects outside the store: a recovery point
//     (idempotency.Step "charge") around a ledger write guarded by the
//     lease's fence (a stale holder's write is refused) and sent with the
//     request's downstream key, which the gateway de-duplicates (so a
//     takeover after a crash between the charge and its recovery point
//     does not charge twice).
//   - redis-do: the same on the Redis store: the fence and the recovery
//     points come from Redis, the ledger stays in PostgreSQL.
//   - pg-tx: postgres.TxExecutor: the ledger row is written in the
//     transaction that claims and completes the key (no fence, recovery
//     point or downstream de-duplication needed, none used).
//
// With -hooks, the service announces each phase of a request on stdout,
// as "PHASE <phase> <key>", and waits for a line on stdin before going on,
// so that the harness can kill it at that point. Phases, in order:
//
//	before-effect        the key is claimed, nothing charged
//	effect-unrecorded    pg-do, redis-do: charged, recovery point not yet recorded
//	after-effect         charged (and recorded), the key not yet completed
//	after-completion     the key completed (committed), response not yet sent
//
// The MCP edge's charge tool takes {"amount": N} and answers
// {"payment": id} as its structured content; a failed charge is a tool
// error, not marked permanent, so that the key is released.
//
// The service prints "LISTEN <addr>" on stdout once it accepts
// connections. It is a test fixture, not an example to copy: its flags
// carry what a real service would configure.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	goredis "github.com/redis/go-redis/v9"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/httpidem"
	"github.com/exactlyonce/idempotency/mcpidem"
	"github.com/exactlyonce/idempotency/store/postgres"
	"github.com/exactlyonce/idempotency/store/redis"
)

// Phases announced with -hooks.
const (
	PhaseBeforeEffect     = "before-effect"
	PhaseEffectUnrecorded = "effect-unrecorded"
	PhaseAfterEffect      = "after-effect"
	PhaseAfterCompletion  = "after-completion"
)

func main() {
	log.SetFlags(log.Lmicroseconds)
	log.SetPrefix("paysvc: ")
	var c config
	flag.StringVar(&c.mode, "mode", "", "pg-do, pg-tx or redis-do")
	flag.StringVar(&c.edge, "edge", "http", "http (POST /pay) or mcp (the charge tool at /mcp)")
	flag.StringVar(&c.addr, "addr", "127.0.0.1:0", "listen address")
	flag.StringVar(&c.pgURL, "postgres", "", "PostgreSQL URL (the ledger; and the store in pg-do and pg-tx)")
	flag.StringVar(&c.redisAddr, "redis", "", "Redis address (the store in redis-do)")
	flag.StringVar(&c.table, "table", "", "the store's table (pg-do, pg-tx)")
	flag.StringVar(&c.prefix, "prefix", "", "the store's key prefix (redis-do)")
	flag.StringVar(&c.ledger, "ledger", "", "the ledger table; its fence table is <ledger>_fences")
	flag.DurationVar(&c.lease, "lease", time.Second, "the runner's lease")
	flag.BoolVar(&c.defaults, "defaults", false, "the runner's defaults (30s lease, no wait) instead of -lease")
	flag.BoolVar(&c.hooks, "hooks", false, "announce phases on stdout and wait for a line on stdin")
	flag.BoolVar(&c.noDedup, "unsafe-no-downstream-dedup", false,
		"the gateway ignores the downstream key (the harness's check that it would see a second charge)")
	flag.Parse()
	if err := run(c); err != nil {
		log.Fatal(err)
	}
}

type config struct {
	mode, edge, addr, pgURL, redisAddr, table, prefix, ledger string
	lease                                                     time.Duration
	hooks, noDedup, defaults                                  bool
}

func run(c config) error {
	ctx := context.Background()
	if c.pgURL == "" || c.ledger == "" {
		return errors.New("-postgres and -ledger are required")
	}
	pcfg, err := pgxpool.ParseConfig(c.pgURL)
	if err != nil {
		return err
	}
	pcfg.MaxConns = 6 // the server is shared: keep the pool small
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	opts := []idempotency.Option{
		idempotency.WithUnsafeShortDurations(),
		idempotency.WithLease(c.lease),
		idempotency.WithRetention(10 * time.Minute),
		idempotency.WithStoreTimeout(c.lease / 3),
		// A retry that finds the crashed holder's key waits for its lease
		// to end and takes it over, instead of a 409 and a 1s Retry-After.
		idempotency.WithWait(10 * c.lease),
	}
	if c.defaults {
		opts = nil
	}
	s := &service{pool: pool, noDedup: c.noDedup, ledger: pgx.Identifier{c.ledger}.Sanitize(),
		fences: pgx.Identifier{c.ledger + "_fences"}.Sanitize()}
	if c.hooks {
		s.in = bufio.NewReader(os.Stdin)
	}
	var exec idempotency.Executor
	var pay payFunc
	switch c.mode {
	case "pg-do", "pg-tx":
		store, err := postgres.New(pool, &postgres.Options{Table: c.table})
		if err != nil {
			return err
		}
		runner, err := idempotency.New(store, opts...)
		if err != nil {
			return err
		}
		exec, pay = runner, s.payDo
		if c.mode == "pg-tx" {
			if exec, err = postgres.NewTxExecutor(pool, runner, nil); err != nil {
				return err
			}
			pay = s.payTx
		}
	case "redis-do":
		client := goredis.NewClient(&goredis.Options{Addr: c.redisAddr, PoolSize: 6})
		defer client.Close()
		store, err := redis.New(client, &redis.Options{Prefix: c.prefix})
		if err != nil {
			return err
		}
		runner, err := idempotency.New(store, opts...)
		if err != nil {
			return err
		}
		exec, pay = runner, s.payDo
	default:
		return fmt.Errorf("-mode %q: want pg-do, pg-tx or redis-do", c.mode)
	}
	mux := http.NewServeMux()
	switch c.edge {
	case "http":
		idem, err := httpidem.New(exec, httpidem.WithScope(func(r *http.Request) ([]string, error) {
			return []string{"chaos", "POST /pay"}, nil
		}))
		if err != nil {
			return err
		}
		mux.Handle("POST /pay", s.announceCompletion(idem(s.httpPay(pay))))
	case "mcp":
		idem, err := mcpidem.ServerMiddleware(exec, mcpidem.WithScope(func(context.Context, *mcp.CallToolRequest) ([]string, error) {
			return []string{"chaos", "tools/call charge"}, nil
		}))
		if err != nil {
			return err
		}
		server := mcp.NewServer(&mcp.Implementation{Name: "paysvc", Version: "v1"}, nil)
		mcp.AddTool(server, &mcp.Tool{Name: "charge", Description: "charges the gateway"}, s.toolPay(pay))
		server.AddReceivingMiddleware(s.announceToolCompletion, idem)
		mux.Handle("/mcp", mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server },
			&mcp.StreamableHTTPOptions{Stateless: true}))
	default:
		return fmt.Errorf("-edge %q: want http or mcp", c.edge)
	}

	ln, err := net.Listen("tcp", c.addr)
	if err != nil {
		return err
	}
	fmt.Printf("LISTEN %s\n", ln.Addr())
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second}
	srv.Handler = mux
	return srv.Serve(ln)
}

type service struct {
	pool           *pgxpool.Pool
	ledger, fences string // quoted table names
	noDedup        bool   // -unsafe-no-downstream-dedup

	mu sync.Mutex    // one announcement at a time
	in *bufio.Reader // nil without -hooks
}

// phase announces that the request of key reached phase and waits for the
// harness's go-ahead (which never comes if the harness kills us).
func (s *service) phase(phase, key string) {
	if s.in == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	fmt.Printf("PHASE %s %s\n", phase, key)
	if _, err := s.in.ReadString('\n'); err != nil {
		log.Fatalf("reading the go-ahead for %s %s: %v", phase, key, err)
	}
}

// A payFunc is a mode's payment, made under the key's lease: it returns
// the payment's id, or an error after which the key is released.
type payFunc func(ctx context.Context) (int64, error)

// httpPay is POST /pay: 201 with the payment, or 503 (released).
func (s *service) httpPay(pay payFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id, err := pay(r.Context())
		if err != nil {
			http.Error(w, "charge failed, retry", http.StatusServiceUnavailable) // released
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"payment":%d}`, id)
	}
}

type toolArgs struct {
	Amount int `json:"amount"`
}

type toolResult struct {
	Payment int64 `json:"payment"`
}

// toolPay is the MCP charge tool: the payment, or a tool error (not
// permanent: released).
func (s *service) toolPay(pay payFunc) mcp.ToolHandlerFor[toolArgs, toolResult] {
	return func(ctx context.Context, _ *mcp.CallToolRequest, _ toolArgs) (*mcp.CallToolResult, toolResult, error) {
		id, err := pay(ctx)
		if err != nil {
			return nil, toolResult{}, errors.New("charge failed, retry")
		}
		return nil, toolResult{Payment: id}, nil
	}
}

// payDo is the payment under idempotency.Do (pg-do, redis-do).
func (s *service) payDo(ctx context.Context) (int64, error) {
	info, _ := idempotency.FromContext(ctx)
	s.phase(PhaseBeforeEffect, info.Key)
	id, err := idempotency.Step(ctx, "charge", func(ctx context.Context) (int64, error) {
		dk, err := idempotency.DownstreamKey(ctx, "charge")
		if err != nil {
			return 0, err
		}
		id, err := s.charge(ctx, info.Key, info.Fence, dk)
		if err != nil {
			return 0, err
		}
		s.phase(PhaseEffectUnrecorded, info.Key)
		return id, nil
	})
	if err != nil {
		log.Printf("charge %s (fence %d): %v", info.Key, info.Fence, err)
		return 0, err
	}
	s.phase(PhaseAfterEffect, info.Key)
	return id, nil
}

// errStale is a charge refused by the fence: a holder that lost its lease.
var errStale = errors.New("stale holder: the fence refused the charge")

// charge is the payment gateway, in one transaction: it refuses a holder
// whose fence is smaller than one it has seen for the intent, and returns
// the charge already made under the downstream key dk, if any, instead of
// charging again. The ledger has no unique constraint: a second charge
// would be a second row, and the harness counts rows.
func (s *service) charge(ctx context.Context, intent string, fence int64, dk string) (int64, error) {
	var id int64
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `INSERT INTO `+s.fences+` (intent, fence) VALUES ($1, $2)
			ON CONFLICT (intent) DO UPDATE SET fence = excluded.fence
			WHERE `+s.fences+`.fence <= excluded.fence`, intent, fence)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return errStale
		}
		// The fence row is locked until commit: the lookup and the insert
		// cannot interleave with another holder's.
		if !s.noDedup {
			err = tx.QueryRow(ctx, `UPDATE `+s.ledger+` SET dedups = dedups + 1
				WHERE downstream_key = $1 RETURNING id`, dk).Scan(&id)
			if err == nil {
				return nil
			}
			if !errors.Is(err, pgx.ErrNoRows) {
				return err
			}
		}
		return tx.QueryRow(ctx, `INSERT INTO `+s.ledger+` (intent, downstream_key, fence)
			VALUES ($1, $2, $3) RETURNING id`, intent, dk, fence).Scan(&id)
	})
	return id, err
}

// payTx is the payment under postgres.TxExecutor (pg-tx): the ledger row
// is written in the key's transaction, with no de-duplication of its own.
func (s *service) payTx(ctx context.Context) (int64, error) {
	info, _ := idempotency.FromContext(ctx)
	tx, ok := postgres.TxFromContext(ctx)
	if !ok {
		return 0, errors.New("no transaction")
	}
	s.phase(PhaseBeforeEffect, info.Key)
	var id int64
	if err := tx.QueryRow(ctx, `INSERT INTO `+s.ledger+` (intent, downstream_key, fence)
		VALUES ($1, $2, $3) RETURNING id`, info.Key, "", info.Fence).Scan(&id); err != nil {
		log.Printf("charge %s: %v", info.Key, err)
		return 0, err // rolled back
	}
	s.phase(PhaseAfterEffect, info.Key)
	return id, nil
}

// announceCompletion wraps the middleware: the middleware writes to w only
// after the key completed (Do) or committed (TxExecutor), so the first
// write of a fresh (not replayed) 2xx response is the point between
// completion and response.
func (s *service) announceCompletion(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(&completionWriter{ResponseWriter: w, s: s, key: r.Header.Get(httpidem.DefaultKeyHeader)}, r)
	})
}

type completionWriter struct {
	http.ResponseWriter
	s       *service
	key     string
	written bool
}

func (c *completionWriter) WriteHeader(status int) {
	if !c.written {
		c.written = true
		if status/100 == 2 && c.Header().Get(httpidem.DefaultReplayHeader) == "" {
			c.s.phase(PhaseAfterCompletion, c.key)
		}
	}
	c.ResponseWriter.WriteHeader(status)
}

func (c *completionWriter) Write(b []byte) (int, error) {
	if !c.written {
		c.WriteHeader(http.StatusOK)
	}
	return c.ResponseWriter.Write(b)
}

// announceToolCompletion is announceCompletion for the MCP edge: outside
// the mcpidem middleware, which returns a fresh result only after the key
// completed (or committed), it announces the point between completion and
// answer.
func (s *service) announceToolCompletion(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		res, err := next(ctx, method, req)
		call, ok := req.(*mcp.CallToolRequest)
		r, isResult := res.(*mcp.CallToolResult)
		if method == "tools/call" && ok && isResult && err == nil && !r.IsError && r.Meta[mcpidem.DefaultReplayMeta] != true {
			key, _ := call.Params.Meta[mcpidem.DefaultKeyMeta].(string)
			s.phase(PhaseAfterCompletion, key)
		}
		return res, err
	}
}
