package mongo

// A model of the MongoDB commands and aggregation operators the store
// uses, written from the MongoDB manual, so that the unit tests can run the
// filters and pipelines the store builds without a server. It is a check
// of the store's logic (which record the pipelines produce, which filters
// match, what a duplicate key error leads to), not of MongoDB: where the
// model and the server disagree, the server is right, and only the
// real-server suite (server_test.go) can tell. Each command runs under one
// mutex, which is what MongoDB guarantees of a single-document write.

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
)

// missing is the value of a field that does not exist.
type missingValue struct{}

var missing = missingValue{}

// model is a collection in memory.
type model struct {
	mu   sync.Mutex
	now  func() time.Time
	docs map[string]bson.D
	// between, when set, runs after every command, outside the lock: a
	// test's way to change the record between two commands of one call.
	between func(command string)
	// commands counts the commands sent, by name.
	commands map[string]int
	info     bson.D // buildInfo's reply
	hello    bson.D // hello's reply, without localTime
	coll     bson.D // the collection's collation, if any
	ttl      bool   // the TTL index was created
	started  bool   // the partial index of STARTED records was created
}

func newModel(now func() time.Time) *model {
	return &model{
		now:      now,
		docs:     map[string]bson.D{},
		commands: map[string]int{},
		info:     bson.D{{Key: "version", Value: "7.0.14"}, {Key: "versionArray", Value: bson.A{int32(7), int32(0), int32(14), int32(0)}}},
		hello:    bson.D{{Key: "isWritablePrimary", Value: true}, {Key: "setName", Value: "rs0"}},
	}
}

// idKey is the map key of an _id value.
func idKey(v any) string {
	switch v := v.(type) {
	case string:
		return "s:" + v
	case bson.Binary:
		return "b:" + string(v.Data)
	case bson.RawValue:
		return idKey(normalize(v))
	}
	panic(fmt.Sprintf("model: _id of type %T", v))
}

// clockNow is the model's $$NOW: the clock, in whole milliseconds.
func (m *model) clockNow() bson.DateTime { return bson.NewDateTimeFromTime(m.now()) }

func (m *model) done(command string) {
	m.mu.Lock()
	m.commands[command]++
	between := m.between
	m.mu.Unlock()
	if between != nil {
		between(command)
	}
}

func (m *model) findOneAndUpdate(ctx context.Context, filter bson.D, pipeline bson.A, let bson.D) (bson.Raw, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	defer m.done("findAndModify")
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.clockNow()
	vars := evalLet(let, now)
	id := filterID(filter)
	doc, exists := m.docs[idKey(id)]
	switch {
	case exists && matches(doc, filter, vars, now):
	case exists:
		// The upsert inserts a document with the same _id.
		return nil, mongo.CommandError{Code: 11000, Message: fmt.Sprintf("E11000 duplicate key error collection: idem.records index: _id_ dup key: { _id: %v }", id)}
	default:
		doc = bson.D{{Key: fieldID, Value: id}}
	}
	out, err := applyPipeline(doc, pipeline, vars, now)
	if err != nil {
		return nil, err
	}
	if err := checkSize(out); err != nil {
		return nil, err
	}
	m.docs[idKey(id)] = out
	return bson.Marshal(out)
}

func (m *model) updateOne(ctx context.Context, filter bson.D, pipeline bson.A, let bson.D) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	defer m.done("update")
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.clockNow()
	vars := evalLet(let, now)
	id := filterID(filter)
	doc, exists := m.docs[idKey(id)]
	if !exists || !matches(doc, filter, vars, now) {
		return 0, nil
	}
	out, err := applyPipeline(doc, pipeline, vars, now)
	if err != nil {
		return 0, err
	}
	if err := checkSize(out); err != nil {
		return 0, err
	}
	m.docs[idKey(id)] = out
	return 1, nil
}

// checkSize refuses a document over 16 MiB as the server does.
func checkSize(doc bson.D) error {
	b, err := bson.Marshal(doc)
	if err != nil {
		return err
	}
	if len(b) > 16<<20 {
		return mongo.CommandError{Code: codeBSONObjectTooLarge, Message: fmt.Sprintf("BSONObj size: %d is invalid", len(b))}
	}
	return nil
}

func (m *model) findOne(ctx context.Context, filter, projection bson.D) (bson.Raw, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	defer m.done("find")
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.clockNow()
	doc, exists := m.docs[idKey(filterID(filter))]
	if !exists || !matches(doc, filter, nil, now) {
		return nil, nil
	}
	return bson.Marshal(project(doc, projection, now))
}

// project applies a find projection: the _id, fields included with 1,
// and computed fields.
func project(doc, projection bson.D, now bson.DateTime) bson.D {
	out := bson.D{{Key: fieldID, Value: lookup(doc, fieldID)}}
	for _, p := range projection {
		var v any
		if n, ok := p.Value.(int); ok && n == 1 {
			v = lookup(doc, p.Key)
		} else {
			v = eval(p.Value, &scope{root: doc, now: now})
		}
		if v != missing {
			out = append(out, bson.E{Key: p.Key, Value: v})
		}
	}
	return out
}

func (m *model) expiredIDs(ctx context.Context, now time.Time, limit int64) ([]any, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	defer m.done("find")
	m.mu.Lock()
	defer m.mu.Unlock()
	cut := bson.NewDateTimeFromTime(now)
	var ids []any
	for _, k := range slices.Sorted(mapKeys(m.docs)) {
		doc := m.docs[k]
		if x, ok := lookup(doc, fieldDelete).(bson.DateTime); ok && x < cut {
			ids = append(ids, lookup(doc, fieldID))
			if int64(len(ids)) == limit {
				break
			}
		}
	}
	return ids, nil
}

func (m *model) deleteExpired(ctx context.Context, ids []any, now time.Time) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	defer m.done("delete")
	m.mu.Lock()
	defer m.mu.Unlock()
	cut := bson.NewDateTimeFromTime(now)
	var n int64
	for _, id := range ids {
		k := idKey(id)
		if doc, ok := m.docs[k]; ok {
			if x, ok := lookup(doc, fieldDelete).(bson.DateTime); ok && x < cut {
				delete(m.docs, k)
				n++
			}
		}
	}
	return n, nil
}

func (m *model) serverInfo(ctx context.Context) (bson.Raw, bson.Raw, error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	defer m.done("buildInfo+hello")
	m.mu.Lock()
	defer m.mu.Unlock()
	info, err := bson.Marshal(m.info)
	if err != nil {
		return nil, nil, err
	}
	hello, err := bson.Marshal(append(slices.Clone(m.hello), bson.E{Key: "localTime", Value: m.clockNow()}))
	return info, hello, err
}

func (m *model) collation(ctx context.Context) (bson.Raw, error) {
	defer m.done("listCollections")
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.coll == nil {
		return nil, nil
	}
	return bson.Marshal(m.coll)
}

func (m *model) createIndexes(ctx context.Context) error {
	defer m.done("createIndexes")
	m.mu.Lock()
	m.ttl, m.started = true, true
	m.mu.Unlock()
	return nil
}

// find runs a query: the filter on every document, then the sort and the
// limit, then the projection (as findOne's).
func (m *model) find(ctx context.Context, filter, sort, projection bson.D, limit int64) ([]bson.Raw, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	defer m.done("find")
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.clockNow()
	var found []bson.D
	for _, doc := range m.docs {
		if matches(doc, filter, nil, now) {
			found = append(found, doc)
		}
	}
	slices.SortFunc(found, func(a, b bson.D) int {
		for _, k := range sort {
			if c := compare(lookup(a, k.Key), lookup(b, k.Key)); c != 0 {
				if normalize(k.Value) == int64(-1) {
					return -c
				}
				return c
			}
		}
		return 0
	})
	if limit > 0 && int64(len(found)) > limit {
		found = found[:limit]
	}
	out := make([]bson.Raw, len(found))
	for i, doc := range found {
		raw, err := bson.Marshal(project(doc, projection, now))
		if err != nil {
			return nil, err
		}
		out[i] = raw
	}
	return out, nil
}

func (m *model) serverNow(ctx context.Context) (time.Time, error) {
	if err := ctx.Err(); err != nil {
		return time.Time{}, err
	}
	defer m.done("hello")
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.clockNow().Time(), nil
}

func (m *model) causal(ctx context.Context) (context.Context, func(), error) {
	return ctx, func() {}, nil
}

// doc returns the stored document under key, or nil.
func (m *model) doc(key string) bson.D {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.docs[idKey(encodeString(key))])
}

// set replaces the stored document under key (a test's direct write).
func (m *model) set(key string, doc bson.D) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.docs[idKey(encodeString(key))] = doc
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// filterID returns the _id equality of a filter; every filter the store
// sends for one record has one.
func filterID(filter bson.D) any {
	for _, e := range filter {
		if e.Key == fieldID {
			return e.Value
		}
	}
	panic(fmt.Sprintf("model: filter without _id: %v", filter))
}

// evalLet evaluates a let document: its values are expressions. The
// document goes through BSON first, as it does on the wire, so the model
// keeps no slice of the caller's.
func evalLet(let bson.D, now bson.DateTime) map[string]any {
	vars := map[string]any{}
	raw, err := bson.Marshal(let)
	if err != nil {
		panic(err)
	}
	let = nil
	if err := bson.Unmarshal(raw, &let); err != nil {
		panic(err)
	}
	for _, e := range let {
		vars[e.Key] = eval(e.Value, &scope{now: now})
	}
	return vars
}

// matches evaluates a query filter: field equality, $expr, $and, $or, and
// {$lt: v}, {$in: [...]} on a field.
func matches(doc, filter bson.D, vars map[string]any, now bson.DateTime) bool {
	for _, e := range filter {
		switch e.Key {
		case "$expr":
			if !truthy(eval(e.Value, &scope{root: doc, vars: vars, now: now})) {
				return false
			}
		case "$and", "$or":
			any1 := false
			all := true
			for _, sub := range e.Value.(bson.A) {
				if matches(doc, sub.(bson.D), vars, now) {
					any1 = true
				} else {
					all = false
				}
			}
			if e.Key == "$and" && !all || e.Key == "$or" && !any1 {
				return false
			}
		default:
			got := lookup(doc, e.Key)
			if cond, ok := e.Value.(bson.D); ok && len(cond) > 0 && strings.HasPrefix(cond[0].Key, "$") {
				for _, c := range cond {
					switch c.Key {
					case "$lt", "$lte", "$gt", "$gte":
						// Type bracketing: a comparison matches values of
						// the operand's type class only.
						want := normalize(c.Value)
						if got == missing || typeClass(got) != typeClass(want) {
							return false
						}
						cmp := compare(got, want)
						if !map[string]bool{"$lt": cmp < 0, "$lte": cmp <= 0, "$gt": cmp > 0, "$gte": cmp >= 0}[c.Key] {
							return false
						}
					case "$type":
						if got == missing || typeName(got) != c.Value.(string) {
							return false
						}
					case "$in":
						found := false
						for _, w := range c.Value.(bson.A) {
							if got != missing && compare(got, normalize(w)) == 0 {
								found = true
							}
						}
						if !found {
							return false
						}
					default:
						panic("model: query operator " + c.Key)
					}
				}
				continue
			}
			if got == missing || compare(got, normalize(e.Value)) != 0 {
				return false
			}
		}
	}
	return true
}

// applyPipeline runs the update pipeline's stages on doc.
func applyPipeline(doc bson.D, pipeline bson.A, vars map[string]any, now bson.DateTime) (bson.D, error) {
	cur := slices.Clone(doc)
	for _, st := range pipeline {
		stage := st.(bson.D)
		if len(stage) != 1 {
			return nil, fmt.Errorf("model: stage %v", stage)
		}
		s := &scope{root: cur, vars: vars, now: now}
		switch stage[0].Key {
		case "$set", "$addFields":
			next := slices.Clone(cur)
			for _, f := range stage[0].Value.(bson.D) {
				next = setField(next, f.Key, eval(f.Value, s))
			}
			cur = next
		case "$replaceWith":
			out, ok := eval(stage[0].Value, s).(bson.D)
			if !ok {
				return nil, mongo.CommandError{Code: 40228, Message: "'replacement document' must evaluate to an object"}
			}
			cur = out
		case "$unset":
			for _, f := range stage[0].Value.(bson.A) {
				cur = setField(cur, f.(string), missing)
			}
		default:
			return nil, fmt.Errorf("model: update stage %s", stage[0].Key)
		}
	}
	if compare(lookup(cur, fieldID), lookup(doc, fieldID)) != 0 {
		return nil, mongo.CommandError{Code: 66, Message: "Performing an update on the path '_id' would modify the immutable field '_id'"}
	}
	return cur, nil
}

// setField sets or (with missing) removes a top-level field, keeping the
// order of the others.
func setField(doc bson.D, name string, v any) bson.D {
	for i, e := range doc {
		if e.Key == name {
			if v == missing {
				return slices.Delete(doc, i, i+1)
			}
			doc[i].Value = v
			return doc
		}
	}
	if v == missing {
		return doc
	}
	return append(doc, bson.E{Key: name, Value: v})
}

// lookup reads a dotted path of a document.
func lookup(doc bson.D, path string) any {
	var cur any = doc
	for _, part := range strings.Split(path, ".") {
		d, ok := cur.(bson.D)
		if !ok {
			return missing
		}
		cur = missing
		for _, e := range d {
			if e.Key == part {
				cur = normalize(e.Value)
				break
			}
		}
	}
	return cur
}

// normalize turns the Go values the store builds (and raw values) into the
// model's: int64, float64, string, bool, nil, bson.Binary, bson.DateTime,
// bson.D, bson.A.
func normalize(v any) any {
	switch v := v.(type) {
	case int:
		return int64(v)
	case int32:
		return int64(v)
	case time.Time:
		return bson.NewDateTimeFromTime(v)
	case bson.RawValue:
		var out any
		if err := v.Unmarshal(&out); err != nil {
			panic(err)
		}
		return normalize(out)
	case bson.M:
		panic("model: unordered document")
	}
	return v
}

type scope struct {
	root bson.D
	vars map[string]any
	now  bson.DateTime
}

func (s *scope) with(vars map[string]any) *scope {
	n := &scope{root: s.root, now: s.now, vars: map[string]any{}}
	for k, v := range s.vars {
		n.vars[k] = v
	}
	for k, v := range vars {
		n.vars[k] = v
	}
	return n
}

// eval evaluates an aggregation expression.
func eval(e any, s *scope) any {
	switch e := e.(type) {
	case string:
		switch {
		case strings.HasPrefix(e, "$$"):
			name, path, _ := strings.Cut(e[2:], ".")
			var v any
			switch name {
			case "NOW":
				v = s.now
			case "ROOT", "CURRENT":
				v = s.root
			case "REMOVE":
				v = missing
			default:
				var ok bool
				if v, ok = s.vars[name]; !ok {
					panic("model: undefined variable " + name)
				}
			}
			if path != "" {
				d, ok := v.(bson.D)
				if !ok {
					return missing
				}
				return lookup(d, path)
			}
			return v
		case strings.HasPrefix(e, "$"):
			return lookup(s.root, e[1:])
		}
		return e
	case bson.A:
		out := make(bson.A, len(e))
		for i, x := range e {
			v := eval(x, s)
			if v == missing {
				v = nil
			}
			out[i] = v
		}
		return out
	case bson.D:
		if len(e) == 1 && strings.HasPrefix(e[0].Key, "$") {
			return operator(e[0].Key, e[0].Value, s)
		}
		out := bson.D{}
		for _, f := range e {
			if strings.HasPrefix(f.Key, "$") {
				panic("model: operator in an object expression: " + f.Key)
			}
			if v := eval(f.Value, s); v != missing {
				out = append(out, bson.E{Key: f.Key, Value: v})
			}
		}
		return out
	}
	return normalize(e)
}

func args(v any, s *scope) []any {
	a, ok := v.(bson.A)
	if !ok {
		return []any{eval(v, s)}
	}
	out := make([]any, len(a))
	for i, x := range a {
		out[i] = eval(x, s)
	}
	return out
}

func isNullish(v any) bool { return v == nil || v == missing }

func truthy(v any) bool {
	switch v := v.(type) {
	case nil, missingValue:
		return false
	case bool:
		return v
	case int64:
		return v != 0
	case float64:
		return v != 0
	}
	return true
}

func operator(name string, arg any, s *scope) any {
	switch name {
	case "$literal":
		return normalize(arg)
	case "$and":
		for _, x := range arg.(bson.A) {
			if !truthy(eval(x, s)) {
				return false
			}
		}
		return true
	case "$or":
		for _, x := range arg.(bson.A) {
			if truthy(eval(x, s)) {
				return true
			}
		}
		return false
	case "$not":
		return !truthy(args(arg, s)[0])
	case "$eq", "$ne", "$gt", "$gte", "$lt", "$lte":
		a := args(arg, s)
		c := compare(a[0], a[1])
		return map[string]bool{"$eq": c == 0, "$ne": c != 0, "$gt": c > 0, "$gte": c >= 0, "$lt": c < 0, "$lte": c <= 0}[name]
	case "$in":
		a := args(arg, s)
		arr, ok := a[1].(bson.A)
		if !ok {
			panic("model: $in needs an array")
		}
		for _, x := range arr {
			if compare(a[0], x) == 0 {
				return true
			}
		}
		return false
	case "$type":
		return typeName(args(arg, s)[0])
	case "$max":
		var best any = nil
		for _, x := range args(arg, s) {
			if isNullish(x) {
				continue
			}
			if best == nil || compare(x, best) > 0 {
				best = x
			}
		}
		return best
	case "$add":
		var sum int64
		var date *bson.DateTime
		for _, x := range args(arg, s) {
			switch x := x.(type) {
			case nil, missingValue:
				return nil
			case int64:
				sum += x
			case bson.DateTime:
				if date != nil {
					panic("model: $add of two dates")
				}
				date = &x
			default:
				panic(fmt.Sprintf("model: $add of %T", x))
			}
		}
		if date != nil {
			return *date + bson.DateTime(sum)
		}
		return sum
	case "$subtract":
		a := args(arg, s)
		if isNullish(a[0]) || isNullish(a[1]) {
			return nil
		}
		switch x := a[0].(type) {
		case bson.DateTime:
			switch y := a[1].(type) {
			case bson.DateTime:
				return int64(x - y)
			case int64:
				return x - bson.DateTime(y)
			}
		case int64:
			return x - a[1].(int64)
		}
		panic(fmt.Sprintf("model: $subtract of %T and %T", a[0], a[1]))
	case "$toLong":
		switch x := args(arg, s)[0].(type) {
		case nil, missingValue:
			return nil
		case bson.DateTime:
			return int64(x)
		case int64:
			return x
		case float64:
			return int64(math.Trunc(x))
		}
		panic("model: $toLong")
	case "$toDate":
		switch x := args(arg, s)[0].(type) {
		case nil, missingValue:
			return nil
		case bson.DateTime:
			return x
		case int64:
			return bson.DateTime(x)
		}
		panic("model: $toDate")
	case "$ifNull":
		a := arg.(bson.A)
		for _, x := range a[:len(a)-1] {
			if v := eval(x, s); !isNullish(v) {
				return v
			}
		}
		return eval(a[len(a)-1], s)
	case "$cond":
		var ifE, thenE, elseE any
		if a, ok := arg.(bson.A); ok {
			ifE, thenE, elseE = a[0], a[1], a[2]
		} else {
			for _, f := range arg.(bson.D) {
				switch f.Key {
				case "if":
					ifE = f.Value
				case "then":
					thenE = f.Value
				case "else":
					elseE = f.Value
				}
			}
		}
		if truthy(eval(ifE, s)) {
			return eval(thenE, s)
		}
		return eval(elseE, s)
	case "$switch":
		var def any = nil
		hasDefault := false
		for _, f := range arg.(bson.D) {
			switch f.Key {
			case "branches":
				for _, b := range f.Value.(bson.A) {
					var c, t any
					for _, bf := range b.(bson.D) {
						switch bf.Key {
						case "case":
							c = bf.Value
						case "then":
							t = bf.Value
						}
					}
					if truthy(eval(c, s)) {
						return eval(t, s)
					}
				}
			case "default":
				def, hasDefault = f.Value, true
			}
		}
		if !hasDefault {
			panic("model: $switch without a matching branch or a default")
		}
		return eval(def, s)
	case "$let":
		var varsE bson.D
		var in any
		for _, f := range arg.(bson.D) {
			switch f.Key {
			case "vars":
				varsE = f.Value.(bson.D)
			case "in":
				in = f.Value
			}
		}
		vars := map[string]any{}
		for _, v := range varsE {
			vars[v.Key] = eval(v.Value, s)
		}
		return eval(in, s.with(vars))
	case "$mergeObjects":
		out := bson.D{}
		for _, x := range args(arg, s) {
			if isNullish(x) {
				continue
			}
			for _, f := range x.(bson.D) {
				out = setField(out, f.Key, f.Value)
			}
		}
		return out
	case "$filter":
		var input, cond any
		as := "this"
		for _, f := range arg.(bson.D) {
			switch f.Key {
			case "input":
				input = f.Value
			case "cond":
				cond = f.Value
			case "as":
				as = f.Value.(string)
			}
		}
		in := eval(input, s)
		if isNullish(in) {
			return nil
		}
		out := bson.A{}
		for _, x := range in.(bson.A) {
			if truthy(eval(cond, s.with(map[string]any{as: normalize(x)}))) {
				out = append(out, x)
			}
		}
		return out
	case "$concatArrays":
		out := bson.A{}
		for _, x := range args(arg, s) {
			if isNullish(x) {
				return nil
			}
			out = append(out, x.(bson.A)...)
		}
		return out
	}
	panic("model: operator " + name)
}

func typeName(v any) string {
	switch v.(type) {
	case missingValue:
		return "missing"
	case nil:
		return "null"
	case int64:
		return "long"
	case float64:
		return "double"
	case string:
		return "string"
	case bool:
		return "bool"
	case bson.Binary:
		return "binData"
	case bson.DateTime:
		return "date"
	case bson.D:
		return "object"
	case bson.A:
		return "array"
	}
	panic(fmt.Sprintf("model: type of %T", v))
}

// typeClass is BSON's comparison order of types (numbers together).
func typeClass(v any) int {
	switch v.(type) {
	case nil, missingValue:
		return 1
	case int64, float64:
		return 2
	case string:
		return 3
	case bson.D:
		return 4
	case bson.A:
		return 5
	case bson.Binary:
		return 6
	case bool:
		return 8
	case bson.DateTime:
		return 9
	}
	panic(fmt.Sprintf("model: comparison of %T", v))
}

// compare orders two values as MongoDB does under the binary collation:
// by type class first, then by value (strings and binary data byte by
// byte; binary data by length first, then subtype, then bytes).
func compare(a, b any) int {
	a, b = normalize(a), normalize(b)
	ca, cb := typeClass(a), typeClass(b)
	if ca != cb {
		return ca - cb
	}
	switch x := a.(type) {
	case nil, missingValue:
		return 0
	case int64:
		switch y := b.(type) {
		case int64:
			return cmpOrdered(x, y)
		case float64:
			return cmpOrdered(float64(x), y)
		}
	case float64:
		switch y := b.(type) {
		case int64:
			return cmpOrdered(x, float64(y))
		case float64:
			return cmpOrdered(x, y)
		}
	case string:
		return strings.Compare(x, b.(string))
	case bool:
		y := b.(bool)
		switch {
		case x == y:
			return 0
		case !x:
			return -1
		}
		return 1
	case bson.DateTime:
		return cmpOrdered(x, b.(bson.DateTime))
	case bson.Binary:
		y := b.(bson.Binary)
		if c := cmpOrdered(len(x.Data), len(y.Data)); c != 0 {
			return c
		}
		if c := cmpOrdered(x.Subtype, y.Subtype); c != 0 {
			return c
		}
		return bytes.Compare(x.Data, y.Data)
	case bson.D:
		y := b.(bson.D)
		for i := 0; i < len(x) && i < len(y); i++ {
			if c := strings.Compare(x[i].Key, y[i].Key); c != 0 {
				return c
			}
			if c := compare(x[i].Value, y[i].Value); c != 0 {
				return c
			}
		}
		return cmpOrdered(len(x), len(y))
	case bson.A:
		y := b.(bson.A)
		for i := 0; i < len(x) && i < len(y); i++ {
			if c := compare(x[i], y[i]); c != 0 {
				return c
			}
		}
		return cmpOrdered(len(x), len(y))
	}
	panic(fmt.Sprintf("model: comparison of %T and %T", a, b))
}

func cmpOrdered[T int | int64 | float64 | byte | bson.DateTime](a, b T) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
