// Package otelidem exports the outcomes, latencies and leases of an
// idempotency [idempotency.Runner] as OpenTelemetry metrics and traces, in
// a module of its own so that the idempotency package stays free of
// OpenTelemetry. A Prometheus scrape endpoint works through the
// OpenTelemetry Prometheus exporter (see the package example).
//
// Two pieces, used together:
//
//	tel, err := otelidem.New(nil) // the global meter and tracer providers
//	runner, err := idempotency.New(tel.Store(store), idempotency.WithObserver(tel))
//
// The [Observer] counts every call of [idempotency.Do] once by its
// outcome, times fn, tracks the leases held, puts a span around each call
// and annotates the caller's span (an HTTP or gRPC server span) with the
// outcome. The store wrapper ([Observer.Store]) times every store call and
// makes it a child span.
//
// # Metrics
//
// Names and units follow the OpenTelemetry semantic conventions (dotted
// lower-case names, UCUM units, durations in seconds):
//
//	name                                  instrument                     unit     attributes
//	idempotency.calls                     Int64ObservableCounter         {call}   idempotency.outcome, common
//	idempotency.takeovers                 Int64ObservableCounter         {call}   common
//	idempotency.fn.duration               Float64Histogram               s        idempotency.outcome, common
//	idempotency.store.operation.duration  Float64Histogram               s        idempotency.store.operation, error.type (on failure)
//	idempotency.leases.active             Int64ObservableUpDownCounter   {lease}  common
//
// The two counters are kept in atomic counts and reported when the
// reader collects (asynchronous instruments), so a call costs an atomic
// add there instead of the SDK's synchronous path; to the exporter they
// are cumulative sums like any other. A combination of common attributes
// reports its lease count from its first lease on, zero included.
//
// The outcomes (attribute idempotency.outcome) are the words of
// [idempotency.Outcome], the one vocabulary of Result, events and logs:
// completed, replayed, in_progress and so on. A call that took a crashed
// holder's record over counts by its outcome too, and once more in
// idempotency.takeovers. The common attributes are
// idempotency.scope.class ([Options.ScopeClass]), idempotency.operation
// ([Options.Operation]) and the scope parts the service names in
// [Options.ScopeAttributes]. Client keys never become attributes, and
// neither does any scope part (a tenant, an actor) unless the service
// names it: an attribute with one value per client would make one time
// series per client.
//
// A call of Do counts once, by how it ended: a duplicate that waits
// ([idempotency.WithWait]) and then replays counts as replayed. An
// adapter's transactional mode (the PostgreSQL adapter's DoTx and
// TxExecutor) is a call of Do and counts alike. The reconciler's work, which
// is not a call of Do, is counted from the events it reports, one per
// record it resolves. idempotency.leases.active counts the calls of Do of
// this process whose fn holds a lease.
//
// # Traces
//
// Each call of Do is a span named "idempotency.do" with the attributes
// idempotency.outcome, idempotency.fence, idempotency.attempt and
// idempotency.replayed (and the common ones); store calls made through
// the wrapper are its children, named "idempotency.store." and the
// operation ("idempotency.store.claim"), and so are the spans fn makes
// from its context. The span that was current when Do was called (the
// request's span of an instrumented HTTP or gRPC server) gets
// idempotency.outcome and idempotency.replayed as well, so that the
// middleware needs no OpenTelemetry code of its own. A heartbeat's lost
// lease or failed renewal is an event on the call's span. Under a parent
// span that was not sampled, no span is started (as the SDK's default,
// parent-based sampler would decide), which saves its cost on the calls
// a ratio sampler leaves out.
package otelidem

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/exactlyonce/idempotency"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// ScopeName is the instrumentation scope of the meter and the tracer.
const ScopeName = "github.com/exactlyonce/idempotency/otelidem"

// The metric names. See the package documentation for their units and
// attributes.
const (
	MetricCalls         = "idempotency.calls"
	MetricTakeovers     = "idempotency.takeovers"
	MetricFnDuration    = "idempotency.fn.duration"
	MetricStoreDuration = "idempotency.store.operation.duration"
	MetricActiveLeases  = "idempotency.leases.active"
)

// The attribute keys.
const (
	AttrOutcome        = attribute.Key("idempotency.outcome")
	AttrOperation      = attribute.Key("idempotency.operation")
	AttrScopeClass     = attribute.Key("idempotency.scope.class")
	AttrStoreOperation = attribute.Key("idempotency.store.operation")
	AttrFence          = attribute.Key("idempotency.fence")
	AttrAttempt        = attribute.Key("idempotency.attempt")
	AttrReplayed       = attribute.Key("idempotency.replayed")
	// AttrErrorType is the semantic conventions' error.type: on a failed
	// store call, what kind of failure it was (see [Observer.Store]).
	AttrErrorType = attribute.Key("error.type")
)

// numOutcomes bounds the values of [idempotency.Outcome] counted; an
// outcome beyond it (of a later version) counts as OutcomeUnknown.
const numOutcomes = 32

// outcomeOf is o, as an index of the counts.
func outcomeOf(o idempotency.Outcome) idempotency.Outcome {
	if int(o) >= numOutcomes {
		return idempotency.OutcomeUnknown
	}
	return o
}

// counted reports whether an event outside a call of Do (the reconciler's)
// counts as a call: every outcome but the claim acquired, a step of the
// call, and a purge, an operator's act.
func counted(o idempotency.Outcome) bool {
	return o != idempotency.OutcomeAcquired && o != idempotency.OutcomePurged
}

// MaxScopeAttributes is how many scope parts [Options.ScopeAttributes]
// may name.
const MaxScopeAttributes = 4

// DefaultMaxAttributeSets is the default of [Options.MaxAttributeSets].
const DefaultMaxAttributeSets = 1000

// Options configures an [Observer]. The zero value (or nil) uses the
// global providers and puts no scope part and no operation on metrics.
type Options struct {
	// MeterProvider makes the meter. Default: otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// TracerProvider makes the tracer. Default: otel.GetTracerProvider().
	// A [noop.TracerProvider] turns tracing off at no cost per call.
	TracerProvider trace.TracerProvider

	// Operation returns the operation or route a call belongs to, for the
	// attribute idempotency.operation: a route pattern ("POST
	// /payments/{id}") or a method name, never a raw path with IDs in it.
	// It gets the context and scope given to Do. Returning "" leaves the
	// attribute out. Default: none.
	Operation func(ctx context.Context, scope []string) string

	// ScopeClass returns the class of a call's scope, for the attribute
	// idempotency.scope.class: a name for the kind of key space (one per
	// integration, say), never a scope's values. It must return a
	// non-empty value from a small set. Default: "shared" for a call with
	// no scope parts, "scoped" otherwise.
	ScopeClass func(scope []string) string

	// ScopeAttributes names scope parts, by position, to put on metrics
	// and spans as attributes: with the scope [tenant, route],
	// []string{"", "http.route"} exports the route and not the tenant. A
	// part is exported only when it is named here, which is how a service
	// opts in to a tenant ID as an attribute; name only parts with few
	// values, or every value becomes a time series of its own. Up to
	// [MaxScopeAttributes] names; "" skips a position.
	ScopeAttributes []string

	// MaxAttributeSets bounds how many distinct combinations of the
	// common attributes are kept, as the SDK's cardinality limit does:
	// calls of further combinations are recorded with the single attribute
	// otel.metric.overflow=true (and the outcome) instead, and their spans
	// carry that attribute. Default: [DefaultMaxAttributeSets].
	MaxAttributeSets int
}

// Observer is an [idempotency.CallObserver] that records metrics and
// traces. Give it to [idempotency.WithObserver], and wrap the runner's
// store with [Observer.Store]. It is safe for concurrent use.
type Observer struct {
	opts   Options
	tracer trace.Tracer // nil: tracing is off

	// The counters are observed from the atomic counts of each attrs at
	// collection, which costs a call an atomic add instead of the SDK's
	// synchronous path.
	calls        metric.Int64ObservableCounter
	takeovers    metric.Int64ObservableCounter
	fnDuration   metric.Float64Histogram
	storeLatency metric.Float64Histogram
	leases       metric.Int64ObservableUpDownCounter

	// storeOpts[op][errorType] are the options of a store call's latency.
	storeOpts [numStoreOps][numErrorTypes][]metric.RecordOption

	mu       sync.RWMutex
	sets     map[setKey]*attrs
	maxSets  int
	overflow *attrs // for the combinations past maxSets
}

var _ idempotency.CallObserver = (*Observer)(nil)

// New returns an Observer. It returns an error wrapping
// [idempotency.ErrInvalidArgument] for invalid options, or the error of a
// provider that cannot make an instrument.
func New(opts *Options) (*Observer, error) {
	var o Observer
	if opts != nil {
		o.opts = *opts
	}
	if len(o.opts.ScopeAttributes) > MaxScopeAttributes {
		return nil, fmt.Errorf("%w: otelidem: Options.ScopeAttributes names %d parts, at most %d", idempotency.ErrInvalidArgument, len(o.opts.ScopeAttributes), MaxScopeAttributes)
	}
	for _, name := range o.opts.ScopeAttributes {
		switch attribute.Key(name) {
		case AttrOutcome, AttrOperation, AttrScopeClass, AttrFence, AttrAttempt, AttrReplayed:
			return nil, fmt.Errorf("%w: otelidem: Options.ScopeAttributes names %q, an attribute of its own", idempotency.ErrInvalidArgument, name)
		}
	}
	o.opts.ScopeAttributes = append([]string(nil), o.opts.ScopeAttributes...)
	switch {
	case o.opts.MaxAttributeSets < 0:
		return nil, fmt.Errorf("%w: otelidem: Options.MaxAttributeSets(%d) must not be negative", idempotency.ErrInvalidArgument, o.opts.MaxAttributeSets)
	case o.opts.MaxAttributeSets == 0:
		o.opts.MaxAttributeSets = DefaultMaxAttributeSets
	}
	mp := o.opts.MeterProvider
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	tp := o.opts.TracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	switch tp.(type) {
	case noop.TracerProvider, *noop.TracerProvider:
	default:
		o.tracer = tp.Tracer(ScopeName)
	}
	meter := mp.Meter(ScopeName)
	var err error
	if o.calls, err = meter.Int64ObservableCounter(MetricCalls, metric.WithUnit("{call}"),
		metric.WithDescription("Calls of idempotency.Do, by how they ended.")); err != nil {
		return nil, err
	}
	if o.takeovers, err = meter.Int64ObservableCounter(MetricTakeovers, metric.WithUnit("{call}"),
		metric.WithDescription("Calls of idempotency.Do that took over the record of a holder whose lease had ended.")); err != nil {
		return nil, err
	}
	if o.fnDuration, err = meter.Float64Histogram(MetricFnDuration, metric.WithUnit("s"),
		metric.WithDescription("How long the function run under an idempotency key took."),
		metric.WithExplicitBucketBoundaries(durationBuckets...)); err != nil {
		return nil, err
	}
	if o.storeLatency, err = meter.Float64Histogram(MetricStoreDuration, metric.WithUnit("s"),
		metric.WithDescription("How long a call of the idempotency store took, per operation."),
		metric.WithExplicitBucketBoundaries(durationBuckets...)); err != nil {
		return nil, err
	}
	if o.leases, err = meter.Int64ObservableUpDownCounter(MetricActiveLeases, metric.WithUnit("{lease}"),
		metric.WithDescription("Leases held by calls of idempotency.Do whose function runs.")); err != nil {
		return nil, err
	}
	for op := range numStoreOps {
		for et := range numErrorTypes {
			kv := []attribute.KeyValue{AttrStoreOperation.String(storeOpNames[op])}
			if et != errNone {
				kv = append(kv, AttrErrorType.String(errorTypeNames[et]))
			}
			o.storeOpts[op][et] = []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(kv...))}
		}
	}
	o.sets = make(map[setKey]*attrs)
	o.maxSets = o.opts.MaxAttributeSets
	o.overflow = newAttrs([]attribute.KeyValue{attribute.Bool("otel.metric.overflow", true)})
	if _, err := meter.RegisterCallback(o.observe, o.calls, o.takeovers, o.leases); err != nil {
		return nil, err
	}
	return &o, nil
}

// observe reports the counts of every combination of attributes.
func (o *Observer) observe(_ context.Context, obs metric.Observer) error {
	report := func(a *attrs) {
		for oc := range numOutcomes {
			if n := a.counts[oc].Load(); n > 0 {
				obs.ObserveInt64(o.calls, n, a.observe[oc])
			}
		}
		if n := a.takeovers.Load(); n > 0 {
			obs.ObserveInt64(o.takeovers, n, a.base)
		}
		if a.leased.Load() {
			obs.ObserveInt64(o.leases, a.leases.Load(), a.base)
		}
	}
	o.mu.RLock()
	defer o.mu.RUnlock()
	for _, a := range o.sets {
		report(a)
	}
	report(o.overflow)
	return nil
}

// durationBuckets suit both store calls (from a fraction of a millisecond
// in memory) and functions (up to seconds).
var durationBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}

// setKey identifies a combination of the common attributes.
type setKey struct {
	class, operation string
	parts            [MaxScopeAttributes]string
}

// attrs are the ready-made options of one combination of the common
// attributes, and its counts.
type attrs struct {
	common  []attribute.KeyValue // for spans
	start   []trace.SpanStartOption
	base    metric.ObserveOption // the common attributes alone
	observe [numOutcomes]metric.ObserveOption
	record  [numOutcomes][]metric.RecordOption

	counts    [numOutcomes]atomic.Int64 // calls by outcome
	takeovers atomic.Int64              // calls that took a record over
	leases    atomic.Int64              // leases held
	leased    atomic.Bool               // a lease was ever held: report the count
}

// attrsFor returns the attributes of a call with this context and scope.
func (o *Observer) attrsFor(ctx context.Context, scope []string) *attrs {
	var k setKey
	if o.opts.ScopeClass != nil {
		k.class = o.opts.ScopeClass(scope)
	}
	if k.class == "" {
		k.class = "scoped"
		if len(scope) == 0 {
			k.class = "shared"
		}
	}
	if o.opts.Operation != nil {
		k.operation = o.opts.Operation(ctx, scope)
	}
	for i, name := range o.opts.ScopeAttributes {
		if name != "" && i < len(scope) {
			k.parts[i] = scope[i]
		}
	}
	o.mu.RLock()
	a := o.sets[k]
	o.mu.RUnlock()
	if a != nil {
		return a
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if a = o.sets[k]; a != nil {
		return a
	}
	if len(o.sets) >= o.maxSets {
		return o.overflow
	}
	a = newAttrs(o.commonOf(k))
	o.sets[k] = a
	return a
}

// commonOf returns the common attributes of a combination.
func (o *Observer) commonOf(k setKey) []attribute.KeyValue {
	common := []attribute.KeyValue{AttrScopeClass.String(k.class)}
	if k.operation != "" {
		common = append(common, AttrOperation.String(k.operation))
	}
	for i, name := range o.opts.ScopeAttributes {
		if name != "" && k.parts[i] != "" {
			common = append(common, attribute.String(name, k.parts[i]))
		}
	}
	return common
}

func newAttrs(common []attribute.KeyValue) *attrs {
	a := &attrs{common: common}
	a.start = []trace.SpanStartOption{trace.WithAttributes(common...)}
	a.base = metric.WithAttributeSet(attribute.NewSet(common...))
	for oc := range idempotency.Outcome(numOutcomes) {
		kv := append(append([]attribute.KeyValue(nil), common...), AttrOutcome.String(oc.String()))
		opt := metric.WithAttributeSet(attribute.NewSet(kv...))
		a.observe[oc] = opt
		a.record[oc] = []metric.RecordOption{opt}
	}
	return a
}

// call is the observer's state of one call of Do. It is also the context
// StartCall returns, carrying itself as a value without the allocation of
// context.WithValue.
type call struct {
	context.Context // the caller's, with the call's span if traced
	attrs           *attrs
	span            trace.Span // the call's span, or nil
	parent          trace.Span // the caller's span, if it records
	key             string     // the storage key of the call's first event
	holding         atomic.Bool
}

type callKey struct{}

func (c *call) Value(k any) any {
	if k == (callKey{}) {
		return c
	}
	return c.Context.Value(k)
}

// StartCall implements [idempotency.CallObserver]: it starts the call's
// span and picks its attributes.
func (o *Observer) StartCall(ctx context.Context, scope []string) context.Context {
	c := &call{attrs: o.attrsFor(ctx, scope)}
	if o.tracer != nil {
		p := trace.SpanFromContext(ctx)
		if p.IsRecording() {
			c.parent = p
		}
		// Under a parent that was not sampled, the call is not either (the
		// SDK's default, parent-based sampling): skip the work.
		if sc := p.SpanContext(); !sc.IsValid() || sc.IsSampled() {
			ctx, c.span = o.tracer.Start(ctx, "idempotency.do", c.attrs.start...)
			if !c.span.IsRecording() {
				c.span = nil
			}
		}
	}
	c.Context = ctx
	return c
}

// EndCall implements [idempotency.CallObserver]: it counts the call by
// its outcome, records fn's duration and ends the call's span.
func (o *Observer) EndCall(ctx context.Context, s idempotency.Call) {
	c, ok := ctx.(*call)
	if !ok {
		return // not a context StartCall returned
	}
	oc := outcomeOf(s.Outcome)
	c.attrs.counts[oc].Add(1)
	if s.Ran {
		o.fnDuration.Record(c, s.FnDuration.Seconds(), c.attrs.record[oc]...)
	}
	if c.holding.Swap(false) {
		c.attrs.leases.Add(-1)
	}
	if c.parent != nil {
		c.parent.SetAttributes(AttrOutcome.String(oc.String()), AttrReplayed.Bool(s.Replayed))
	}
	if c.span != nil {
		c.span.SetAttributes(
			AttrOutcome.String(oc.String()),
			AttrFence.Int64(s.Fence),
			AttrAttempt.Int(s.Attempt),
			AttrReplayed.Bool(s.Replayed),
		)
		switch oc {
		case idempotency.OutcomeStoreError, idempotency.OutcomeLeaseLost, idempotency.OutcomeCorrupt:
			c.span.SetStatus(codes.Error, s.Err.Error())
		}
		if s.Err == idempotency.ErrFnPanicked {
			c.span.SetStatus(codes.Error, s.Err.Error())
		}
		c.span.End()
	}
}

// Observe implements [idempotency.Observer]. Within a call of Do it
// tracks the call's lease and puts a heartbeat's failures on the call's
// span (the call is counted by EndCall); outside one (the reconciler) it
// counts the event's outcome.
func (o *Observer) Observe(ctx context.Context, e idempotency.Event) {
	if c, _ := ctx.Value(callKey{}).(*call); c != nil {
		if c.key == "" {
			c.key = e.Key
		}
		if c.key == e.Key {
			o.observeInCall(c, e)
			return
		}
		// An event of another execution mode run inside fn: not this
		// call's.
	}
	a := o.attrsFor(ctx, e.Scope)
	if e.Outcome == idempotency.OutcomeAcquired && e.Attempt > 1 {
		a.takeovers.Add(1)
	}
	if counted(e.Outcome) {
		a.counts[outcomeOf(e.Outcome)].Add(1)
	}
}

func (o *Observer) observeInCall(c *call, e idempotency.Event) {
	switch e.Outcome {
	case idempotency.OutcomeAcquired:
		if e.Attempt > 1 {
			c.attrs.takeovers.Add(1)
		}
		if !c.holding.Swap(true) {
			c.attrs.leased.Store(true)
			c.attrs.leases.Add(1)
		}
	case idempotency.OutcomeLeaseLost:
		if c.holding.Swap(false) {
			c.attrs.leases.Add(-1)
		}
		if c.span != nil {
			c.span.AddEvent("idempotency.lease_lost", trace.WithAttributes(attribute.String("exception.message", errText(e.Err))))
		}
	case idempotency.OutcomeStoreError:
		if c.span != nil {
			c.span.AddEvent("idempotency.store_error", trace.WithAttributes(attribute.String("exception.message", errText(e.Err))))
		}
	}
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
