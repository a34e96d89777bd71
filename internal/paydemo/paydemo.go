// Package paydemo is the payments scenario of cmd/paydemo and
// examples/cmd/paydemo, played over HTTP on any [idempotency.Store], and
// its verdict: was every payment intent charged exactly once?
//
// A payments API (POST /payments) runs behind the httpidem middleware on
// the given store. Clients send through httpidem.Transport, which retries
// with the intent's key, over a flaky link that drops responses after the
// server has processed the request and sends some requests twice. The
// scenarios: double clicks, client timeouts followed by retries, 50
// concurrent duplicates, a key reused with a different amount, a worker
// that crashes mid-payment (after charging the card) and is taken over
// once its lease ends, and a batch of ordinary payments over the flaky
// link.
//
// The crash is simulated honestly on every backend: the store is wrapped
// so that once the worker is dead, every call made under its token is
// dropped before it reaches the store, as if the process were gone; its
// lease is neither renewed nor released and must run out.
//
// The package is internal: the root module's command runs it on the
// memory store, and the examples module's command (which may import the
// database drivers) on PostgreSQL or Redis.
package paydemo

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/exactlyonce/idempotency"
	"github.com/exactlyonce/idempotency/httpidem"
)

// Defaults of [Config].
const (
	// DefaultLease is the runner's lease: the shortest the library
	// allows without WithUnsafeShortDurations, so that the crashed
	// worker's payment is taken over within about two seconds. A shorter
	// lease can end while a worker on a loaded machine is still charging,
	// and the takeover then writes a second payment row (the demo's
	// payment row, unlike the charge, is not de-duplicated downstream).
	DefaultLease = idempotency.MinLease
	// NetworkLease is the lease the demo uses on a networked store
	// (PostgreSQL, Redis): the store timeout is a third of it (1s), room
	// for round trips on a loaded machine (a checkpoint or completion that
	// times out after the charge leaves it to the takeover, and the demo's
	// gateway, unlike a real one, does not de-duplicate by the downstream
	// key), and the crash is still taken over within a few seconds.
	NetworkLease = 3 * time.Second
)

// Config configures [Run]. The zero value means the defaults.
type Config struct {
	// Seed seeds the flaky link's randomness (0 means 1).
	Seed uint64
	// Lease is the runner's lease ([idempotency.WithLease]). It bounds
	// how long the crashed worker blocks its payment. 0 means
	// [DefaultLease].
	Lease time.Duration
	// StoreTimeout bounds each store call attempt
	// ([idempotency.WithStoreTimeout]). 0 means the runner's default:
	// [idempotency.DefaultStoreTimeout], or a third of the lease if that
	// is shorter.
	StoreTimeout time.Duration
	// Verbose writes every client outcome to the output as it happens.
	Verbose bool
}

// RegisterFlags defines the flags -seed and -v on fs, which set c.Seed
// and c.Verbose.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.Uint64Var(&c.Seed, "seed", 1, "seed of the flaky link's randomness")
	fs.BoolVar(&c.Verbose, "v", false, "log every client outcome")
}

// Run plays the scenario on store and writes one row per intent to out
// (attempts seen by the server, charges, replays, 409s, 422s, the lease
// attempt that answered, client sends, and the verdict). It reports
// whether every intent was charged exactly once, with one payment row,
// and every client got the answer it should. The store should be empty
// of the demo's keys (they are random, so a shared store is fine); Run
// does not close it. An error means the demo could not be set up.
func Run(store idempotency.Store, cfg Config, out io.Writer) (bool, error) {
	if store == nil {
		return false, errors.New("paydemo: nil store")
	}
	seed := cfg.Seed
	if seed == 0 {
		seed = 1
	}
	lease := cfg.Lease
	if lease == 0 {
		lease = DefaultLease
	}
	opts := []idempotency.Option{
		idempotency.WithLease(lease),
		idempotency.WithRetention(time.Minute),
	}
	if lease < idempotency.MinLease {
		// Asked for by name: a test that wants the takeover in a blink.
		opts = append(opts, idempotency.WithUnsafeShortDurations())
	}
	if cfg.StoreTimeout != 0 {
		opts = append(opts, idempotency.WithStoreTimeout(cfg.StoreTimeout))
	}
	out = &lockedWriter{w: out}
	d := newDemo(store)
	runner, err := idempotency.New(d.store.forRunner(), opts...)
	if err != nil {
		return false, err
	}
	idem, err := httpidem.New(runner, httpidem.WithScope(func(r *http.Request) ([]string, error) {
		customer := r.Header.Get("X-Customer") // the authenticated customer, in a real API
		if customer == "" {
			return nil, httpidem.RejectScope(http.StatusUnauthorized, "no customer")
		}
		return []string{customer}, nil
	}))
	if err != nil {
		return false, err
	}
	mux := http.NewServeMux()
	mux.Handle("POST /payments", idem(http.HandlerFunc(d.pay)))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return false, err
	}
	srv := &http.Server{Handler: d.count(mux)}
	go srv.Serve(ln)
	defer srv.Close()
	base := "http://" + ln.Addr().String()

	link := &flakyLink{base: http.DefaultTransport, rnd: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), drop: 0.2, dup: 0.15}
	tr, err := httpidem.NewTransport(
		httpidem.WithBase(link),
		httpidem.WithAttemptTimeout(400*time.Millisecond),
		httpidem.WithMaxAttempts(12),
		httpidem.WithMaxElapsed(10*time.Second),
		httpidem.WithBackoff(20*time.Millisecond, 300*time.Millisecond),
	)
	if err != nil {
		return false, err
	}
	client := &http.Client{Transport: tr}
	c := &clients{http: client, url: base + "/payments", verbose: cfg.Verbose, out: out}

	var wg sync.WaitGroup
	scenario := func(f func()) { wg.Go(f) }

	// Double click: the button is clicked twice; both clicks carry the
	// intent's key.
	scenario(func() {
		in := c.intent("double-click", "alice", 1250)
		var w sync.WaitGroup
		for i := range 2 {
			w.Go(func() {
				time.Sleep(time.Duration(i) * 30 * time.Millisecond)
				c.pay(in, in.amount, http.StatusCreated)
			})
		}
		w.Wait()
	})
	// Client timeout: the gateway is slower than the client waits; the
	// transport gives up on the attempt and retries with the same key.
	scenario(func() {
		in := c.intent("timeout-then-retry", "bob", 4000)
		in.header = map[string]string{"X-Demo-Gateway-Latency": "700ms"}
		c.pay(in, in.amount, http.StatusCreated)
	})
	// 50 concurrent duplicates of one intent.
	scenario(func() {
		in := c.intent("50-concurrent-duplicates", "carol", 990)
		in.header = map[string]string{"X-Demo-Gateway-Latency": "100ms"}
		var w sync.WaitGroup
		for range 50 {
			w.Go(func() { c.pay(in, in.amount, http.StatusCreated) })
		}
		w.Wait()
	})
	// A key reused with a different amount: refused with 422, never
	// answered with the first payment.
	scenario(func() {
		in := c.intent("key-reused-other-amount", "dave", 100)
		c.pay(in, in.amount, http.StatusCreated)
		c.pay(in, 9999, http.StatusUnprocessableEntity)
	})
	// A worker crashes after charging the card and before answering: its
	// lease runs out, the retry takes the payment over, and the recovery
	// point of the charge keeps the card from being charged again.
	scenario(func() {
		in := c.intent("worker-crash-takeover", "erin", 7300)
		in.wantTakeover = true
		d.crashAfterCharge(in.id())
		c.pay(in, in.amount, http.StatusCreated)
	})
	// Ordinary payments over the flaky link.
	for i := range 20 {
		scenario(func() {
			in := c.intent(fmt.Sprintf("flaky-link-%02d", i+1), "frank", 100+int64(i))
			c.pay(in, in.amount, http.StatusCreated)
		})
	}
	wg.Wait()
	// The crashed worker's goroutine may now end. First: a duplicate the
	// link sent on its own may be the request that crashed, and waiting
	// for the duplicates before this would wait forever.
	d.release()
	link.wait() // the duplicates the link sent on its own
	d.inflight.Wait()

	return d.report(out, c.all()), nil
}

// lockedWriter serializes the writes of the clients' goroutines.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// demo is the server side: the store, the card gateway and the counters.
type demo struct {
	store *crashableStore // the store as the workers see it

	mu       sync.Mutex
	charges  map[string]int    // intent -> cards charged
	calls    map[string]int    // intent -> charge calls the gateway got
	gateway  map[string]string // downstream key -> the charge it made
	payments map[string]int    // intent -> payment rows created
	stats    map[string]*stats
	crash    map[string]bool // intents whose first worker crashes
	nextID   int
	dead     chan struct{}
	inflight sync.WaitGroup // requests the server is handling
}

type stats struct {
	attempts, fresh, replays, conflicts, mismatches, other int
}

func newDemo(store idempotency.Store) *demo {
	return &demo{
		store:    &crashableStore{Store: store, holders: map[string]idempotency.Token{}, dead: map[idempotency.Token]bool{}},
		charges:  map[string]int{},
		calls:    map[string]int{},
		gateway:  map[string]string{},
		payments: map[string]int{},
		stats:    map[string]*stats{},
		crash:    map[string]bool{},
		dead:     make(chan struct{}),
	}
}

func (d *demo) crashAfterCharge(intent string) {
	d.mu.Lock()
	d.crash[intent] = true
	d.mu.Unlock()
}

func (d *demo) release() { close(d.dead) }

type payRequest struct {
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
}

type payResponse struct {
	Payment string `json:"payment"`
	Amount  int64  `json:"amount"`
	Charge  string `json:"charge"`
	Attempt int    `json:"attempt"`
}

// pay is the payments handler. Its phases are recovery points
// (idempotency.Step): a worker that takes a crashed payment over finds
// the payment row and the charge already made and does not repeat them.
func (d *demo) pay(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	var req payRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Amount <= 0 {
		http.Error(w, `{"error":"invalid payment"}`, http.StatusBadRequest)
		return
	}
	info, _ := idempotency.FromContext(ctx)
	intent := r.Header.Get("X-Customer") + "/" + info.Key

	paymentID, err := idempotency.Step(ctx, "payment-row", func(context.Context) (string, error) {
		d.mu.Lock()
		defer d.mu.Unlock()
		d.nextID++
		d.payments[intent]++
		return fmt.Sprintf("pay_%04d", d.nextID), nil
	})
	if err != nil {
		http.Error(w, `{"error":"try again"}`, http.StatusServiceUnavailable)
		return
	}
	chargeKey, _ := idempotency.DownstreamKey(ctx, "charge")
	charge, err := idempotency.Step(ctx, "charge", func(ctx context.Context) (string, error) {
		if lat, err := time.ParseDuration(r.Header.Get("X-Demo-Gateway-Latency")); err == nil {
			time.Sleep(lat) // a slow gateway
		}
		return d.charge(intent, chargeKey), nil
	})
	switch {
	case errors.Is(err, idempotency.ErrLeaseLost):
		// Another worker has taken the payment over: it answers.
		http.Error(w, `{"error":"try again"}`, http.StatusServiceUnavailable)
		return
	case err != nil && charge == "":
		http.Error(w, `{"error":"try again"}`, http.StatusServiceUnavailable)
		return
	}
	// err != nil with a charge: the card was charged but the recovery point
	// not recorded. The charge stands: answer with it rather than a 5xx,
	// which would release the key for a second charge.

	d.mu.Lock()
	crash := d.crash[intent]
	delete(d.crash, intent)
	d.mu.Unlock()
	if crash {
		// The worker dies here: from now on it sends nothing, neither a
		// lease renewal nor a release nor a response.
		d.store.kill(info.StorageKey)
		<-d.dead
		return
	}

	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/payments/"+paymentID)
	w.WriteHeader(http.StatusCreated)
	json.NewEncoder(w).Encode(payResponse{Payment: paymentID, Amount: req.Amount, Charge: charge, Attempt: info.Attempt})
}

// count records, per intent, what the server answered: it sits in front
// of the middleware, so it sees every attempt, including those whose
// response the link then drops.
func (d *demo) count(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d.inflight.Add(1)
		defer d.inflight.Done()
		intent := r.Header.Get("X-Customer") + "/" + r.Header.Get("Idempotency-Key")
		sw := &statusWriter{ResponseWriter: w}
		next.ServeHTTP(sw, r)
		d.mu.Lock()
		defer d.mu.Unlock()
		s := d.stats[intent]
		if s == nil {
			s = &stats{}
			d.stats[intent] = s
		}
		s.attempts++
		switch {
		case sw.status == 0:
			// The crashed worker: no answer at all.
		case sw.Header().Get("Idempotent-Replayed") == "true":
			s.replays++
		case sw.status == http.StatusConflict:
			s.conflicts++
		case sw.status == http.StatusUnprocessableEntity:
			s.mismatches++
		case sw.status == http.StatusCreated:
			s.fresh++
		default:
			s.other++
		}
	})
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(p)
}

// charge is the card gateway. Like Stripe's API, it de-duplicates on the
// idempotency key it is given (the payment's downstream key): a worker
// that takes a payment over after the charge was made but before its
// recovery point was recorded (a crash, or a lease lost on an overloaded
// machine) gets the first charge back instead of charging the card again.
// calls counts what reached the gateway; charges what it charged.
func (d *demo) charge(intent, key string) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.calls[intent]++
	if id, ok := d.gateway[key]; ok {
		return id
	}
	id := "ch_" + key[len("charge:"):len("charge:")+12]
	d.gateway[key] = id
	d.charges[intent]++ // the effect: the card is charged
	return id
}

// report prints the table and says whether every intent was charged once
// and every client got the answer it should.
func (d *demo) report(out io.Writer, intents []*intent) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	ok := true
	fmt.Fprintf(out, "%-26s %8s %7s %7s %7s %5s %5s %5s %7s  %s\n", "intent", "attempts", "gw calls", "charges", "replays", "409s", "422s", "lease", "clients", "result")
	for _, in := range intents {
		s := d.stats[in.id()]
		if s == nil {
			s = &stats{}
		}
		problems := in.problems()
		if n := d.charges[in.id()]; n != 1 {
			problems = append(problems, fmt.Sprintf("charged %d times", n))
		}
		if n := d.payments[in.id()]; n != 1 {
			problems = append(problems, fmt.Sprintf("%d payment rows", n))
		}
		result := "ok"
		if len(problems) > 0 {
			result = "FAIL: " + strings.Join(problems, "; ")
			ok = false
		}
		fmt.Fprintf(out, "%-26s %8d %7d %7d %7d %5d %5d %5d %7d  %s\n", in.name, s.attempts, d.calls[in.id()], d.charges[in.id()], s.replays, s.conflicts, s.mismatches, in.leaseAttempt(), in.sends(), result)
	}
	return ok
}

// crashableStore is the store as seen by the API's workers. A worker that
// crashes is simulated honestly: once killed, every call made under its
// token is dropped before reaching the store, as if the process were
// gone, so its lease is neither renewed nor released and must run out.
type crashableStore struct {
	idempotency.Store

	mu      sync.Mutex
	holders map[string]idempotency.Token // storage key -> last acquiring token
	dead    map[idempotency.Token]bool
}

var errDead = errors.New("paydemo: the worker has crashed; this call was never sent")

func (s *crashableStore) Claim(ctx context.Context, r idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	res, err := s.Store.Claim(ctx, r)
	if err == nil && res.Outcome == idempotency.OutcomeAcquired {
		s.mu.Lock()
		s.holders[r.Key] = r.Token
		s.mu.Unlock()
	}
	return res, err
}

// kill marks the current holder of key as crashed.
func (s *crashableStore) kill(key string) {
	s.mu.Lock()
	s.dead[s.holders[key]] = true
	s.mu.Unlock()
}

func (s *crashableStore) isDead(t idempotency.Token) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.dead[t]
}

func (s *crashableStore) Renew(ctx context.Context, key string, t idempotency.Token, d time.Duration) error {
	if s.isDead(t) {
		return errDead
	}
	return s.Store.Renew(ctx, key, t, d)
}

func (s *crashableStore) Checkpoint(ctx context.Context, key string, t idempotency.Token, name string, v []byte) error {
	if s.isDead(t) {
		return errDead
	}
	return s.Store.Checkpoint(ctx, key, t, name, v)
}

func (s *crashableStore) Complete(ctx context.Context, key string, t idempotency.Token, result []byte, retention time.Duration) error {
	if s.isDead(t) {
		return errDead
	}
	return s.Store.Complete(ctx, key, t, result, retention)
}

func (s *crashableStore) Release(ctx context.Context, key string, t idempotency.Token) error {
	if s.isDead(t) {
		return errDead
	}
	return s.Store.Release(ctx, key, t)
}

// forRunner returns s as the runner should see it: a Watcher exactly
// when the store under it is one, to keep its push of completions for
// waiters, while a store that cannot watch does not look as if it could.
func (s *crashableStore) forRunner() idempotency.Store {
	if _, ok := s.Store.(idempotency.Watcher); ok {
		return watchingStore{s}
	}
	return s
}

// watchingStore is a crashableStore on a store that is also an
// [idempotency.Watcher]: reads are not under a lease, so Watch passes
// through.
type watchingStore struct{ *crashableStore }

func (s watchingStore) Watch(ctx context.Context, key string) error {
	return s.Store.(idempotency.Watcher).Watch(ctx, key)
}

// flakyLink is the network between clients and API: it drops some
// responses after the server has processed the request (the client sees
// a reset connection) and sends some requests twice (a proxy resending).
type flakyLink struct {
	base      http.RoundTripper
	drop, dup float64

	mu  sync.Mutex
	rnd *rand.Rand
	wg  sync.WaitGroup
}

var errDropped = errors.New("flaky link: connection reset by peer")

func (l *flakyLink) roll(p float64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.rnd.Float64() < p
}

func (l *flakyLink) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.GetBody != nil && l.roll(l.dup) {
		dup := req.Clone(context.WithoutCancel(req.Context()))
		if body, err := req.GetBody(); err == nil {
			dup.Body = body
			l.wg.Go(func() {
				if resp, err := l.base.RoundTrip(dup); err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			})
		}
	}
	resp, err := l.base.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	if l.roll(l.drop) {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return nil, errDropped
	}
	return resp, nil
}

func (l *flakyLink) wait() { l.wg.Wait() }

// clients sends payments and keeps what each client saw.
type clients struct {
	http    *http.Client
	url     string
	verbose bool
	out     io.Writer

	mu      sync.Mutex
	intents []*intent
}

// intent is one payment a user means to make: one key, made once, reused
// by every click, retry and duplicate.
type intent struct {
	name, customer, key string
	amount              int64
	header              map[string]string

	mu       sync.Mutex
	results  []result
	payments map[string]bool
	attempt  int // the largest lease attempt a client's response came from

	wantTakeover bool
}

type result struct {
	status, want int
	err          error
}

func (c *clients) intent(name, customer string, amount int64) *intent {
	in := &intent{name: name, customer: customer, key: httpidem.NewKey(), amount: amount, payments: map[string]bool{}}
	c.mu.Lock()
	c.intents = append(c.intents, in)
	c.mu.Unlock()
	return in
}

func (c *clients) all() []*intent {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := append([]*intent(nil), c.intents...)
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

func (in *intent) id() string { return in.customer + "/" + in.key }

// pay sends one payment of the intent and records what came back.
func (c *clients) pay(in *intent, amount int64, want int) {
	body := `{"amount":` + strconv.FormatInt(amount, 10) + `,"currency":"EUR"}`
	req, err := http.NewRequest("POST", c.url, strings.NewReader(body))
	if err != nil {
		panic(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Customer", in.customer)
	for k, v := range in.header {
		req.Header.Set(k, v)
	}
	httpidem.SetKey(req, in.key)
	resp, err := c.http.Do(req)
	res := result{want: want, err: err}
	var pr payResponse
	if err == nil {
		res.status = resp.StatusCode
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusCreated {
			if err := json.Unmarshal(b, &pr); err != nil {
				res.err = err
			}
		}
		if c.verbose {
			fmt.Fprintf(c.out, "  %-26s -> %d replayed=%q %s\n", in.name, resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), bytes.TrimSpace(b))
		}
	} else if c.verbose {
		fmt.Fprintf(c.out, "  %-26s -> error %v\n", in.name, err)
	}
	in.mu.Lock()
	in.results = append(in.results, res)
	if pr.Payment != "" {
		in.payments[pr.Payment] = true
	}
	in.attempt = max(in.attempt, pr.Attempt)
	in.mu.Unlock()
}

func (in *intent) leaseAttempt() int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.attempt
}

func (in *intent) sends() int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return len(in.results)
}

// problems lists what the intent's clients saw that they should not have:
// an error, an unexpected status, or two different payments.
func (in *intent) problems() []string {
	in.mu.Lock()
	defer in.mu.Unlock()
	var p []string
	for _, r := range in.results {
		switch {
		case r.err != nil:
			p = append(p, "client error: "+r.err.Error())
		case r.status != r.want:
			p = append(p, fmt.Sprintf("client got %d, want %d", r.status, r.want))
		}
	}
	if len(in.payments) > 1 {
		p = append(p, fmt.Sprintf("clients saw %d different payments", len(in.payments)))
	}
	if in.wantTakeover && in.attempt < 2 {
		p = append(p, "the crashed payment was not taken over")
	}
	return p
}
