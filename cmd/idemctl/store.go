package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/exactlyonce/idempotency"
	idemetcd "github.com/exactlyonce/idempotency/store/etcd"
	idemmongo "github.com/exactlyonce/idempotency/store/mongo"
	"github.com/exactlyonce/idempotency/store/postgres"
	"github.com/exactlyonce/idempotency/store/redis"
	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/x/mongo/driver/connstring"
	"go.uber.org/zap"
)

// A storeFlag is a flag that reaches the store: the selectors name the
// backend (exactly one of them), the others are its options. Each can
// also come from the environment, as IDEMCTL_ and its name in capitals
// with underscores (IDEMCTL_POSTGRES, IDEMCTL_ETCD_ENDPOINTS, ...), so
// that a DSN with a password need not be typed on a command line.
type storeFlag struct {
	name, help string
	selector   bool
}

var storeFlags = []storeFlag{
	{name: "postgres", selector: true, help: "PostgreSQL URL of the service's database"},
	{name: "schema", help: "PostgreSQL schema of the store's table, as the service's postgres.Options.Schema (default: the search path)"},
	{name: "table", help: "the store's table, as the service's postgres.Options.Table (default " + postgres.DefaultTable + ")"},
	{name: "redis", selector: true, help: "Redis address host:port"},
	{name: "redis-cluster", selector: true, help: "Redis Cluster addresses, comma-separated"},
	{name: "etcd-endpoints", selector: true, help: "etcd endpoints host:port, comma-separated"},
	{name: "prefix", help: "the store's key prefix, as the service's redis.Options.Prefix (default " + redis.DefaultPrefix + ") or etcd.Options.Prefix (default " + idemetcd.DefaultPrefix + ")"},
	{name: "mongo-uri", selector: true, help: "MongoDB connection string"},
	{name: "mongo-database", help: "MongoDB database of the store's collection (default: the one in -mongo-uri)"},
	{name: "mongo-collection", help: "MongoDB collection the service gave mongo.New"},
}

// envName is the environment variable of a store flag.
func envName(flag string) string {
	return "IDEMCTL_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// storeConfig is the value of every store flag, by name.
type storeConfig map[string]string

// resolve fills in from getenv the store flags not given on the command
// line (set): every option, and the selectors only when the command line
// names none, so that a selector given there always wins over the
// environment's.
func (c storeConfig) resolve(set map[string]bool, getenv func(string) string) {
	chose := false
	for _, f := range storeFlags {
		chose = chose || f.selector && set[f.name]
	}
	for _, f := range storeFlags {
		if set[f.name] || f.selector && chose {
			continue
		}
		if v := getenv(envName(f.name)); v != "" {
			c[f.name] = v
		}
	}
}

// backend is the one selector set, or an error naming them all.
func (c storeConfig) backend() (string, error) {
	var chosen, all []string
	for _, f := range storeFlags {
		if !f.selector {
			continue
		}
		all = append(all, "-"+f.name)
		if c[f.name] != "" {
			chosen = append(chosen, "-"+f.name)
		}
	}
	switch len(chosen) {
	case 1:
		return chosen[0][1:], nil
	case 0:
		return "", usage("no store: give one of %s (or its IDEMCTL_ variable, e.g. %s)", strings.Join(all, ", "), envName("postgres"))
	}
	return "", usage("give one store, not %s", strings.Join(chosen, " and "))
}

// only refuses the options that the backend does not take.
func (c storeConfig) only(backend string, allowed ...string) error {
	for _, f := range storeFlags {
		if !f.selector && c[f.name] != "" && !contains(allowed, f.name) {
			return usage("-%s is not an option of -%s (it takes %s)", f.name, backend, dashed(allowed))
		}
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func dashed(names []string) string {
	if len(names) == 0 {
		return "no options"
	}
	d := make([]string, len(names))
	for i, n := range names {
		d[i] = "-" + n
	}
	return strings.Join(d, " and ")
}

// openStore opens the store the configuration names. It creates nothing:
// no table, index or collection (a mistyped name is reported, not made).
func openStore(ctx context.Context, c storeConfig) (idempotency.Store, func(), error) {
	backend, err := c.backend()
	if err != nil {
		return nil, nil, err
	}
	switch backend {
	case "postgres":
		if err := c.only(backend, "schema", "table"); err != nil {
			return nil, nil, err
		}
		pool, err := pgxpool.New(ctx, c["postgres"])
		if err != nil {
			return nil, nil, usage("-postgres: %w", err)
		}
		s, err := postgres.New(pool, &postgres.Options{Schema: c["schema"], Table: c["table"]})
		if err != nil {
			pool.Close()
			return nil, nil, usageError{err}
		}
		return s, pool.Close, nil
	case "redis", "redis-cluster":
		if err := c.only(backend, "prefix"); err != nil {
			return nil, nil, err
		}
		var client goredis.UniversalClient
		if backend == "redis" {
			client = goredis.NewClient(&goredis.Options{Addr: c["redis"], ContextTimeoutEnabled: true})
		} else {
			client = goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: strings.Split(c["redis-cluster"], ","), ContextTimeoutEnabled: true})
		}
		s, err := redis.New(client, &redis.Options{Prefix: c["prefix"]})
		if err != nil {
			client.Close()
			return nil, nil, usageError{err}
		}
		return s, func() { client.Close() }, nil
	case "etcd-endpoints":
		if err := c.only(backend, "prefix"); err != nil {
			return nil, nil, err
		}
		// The client's logger is silenced: during an outage it would
		// print a warning per retry, burying idemctl's one line.
		client, err := clientv3.New(clientv3.Config{Endpoints: strings.Split(c["etcd-endpoints"], ","), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			return nil, nil, usage("-etcd-endpoints: %w", err)
		}
		s, err := idemetcd.New(client, &idemetcd.Options{Prefix: c["prefix"]})
		if err != nil {
			client.Close()
			return nil, nil, usageError{err}
		}
		return s, func() { client.Close() }, nil
	}
	return openMongo(ctx, c)
}

// openMongo opens the store on the service's collection, which must
// exist: Migrate would otherwise create a collection of a mistyped name,
// and its indexes. The store never creates indexes here (SkipIndex): the
// service's own Migrate does.
func openMongo(ctx context.Context, c storeConfig) (idempotency.Store, func(), error) {
	if err := c.only("mongo-uri", "mongo-database", "mongo-collection"); err != nil {
		return nil, nil, err
	}
	cs, err := connstring.ParseAndValidate(c["mongo-uri"])
	if err != nil {
		return nil, nil, usage("-mongo-uri: %w", err)
	}
	db, name := c["mongo-database"], c["mongo-collection"]
	if db == "" {
		db = cs.Database
	}
	if db == "" || name == "" {
		return nil, nil, usage("-mongo-uri needs -mongo-collection, and -mongo-database unless the URI names the database: the service's collection, as it gave mongo.New")
	}
	client, err := mongo.Connect(options.Client().ApplyURI(c["mongo-uri"]).SetServerSelectionTimeout(5 * time.Second))
	if err != nil {
		return nil, nil, usage("-mongo-uri: %w", err)
	}
	closeClient := func() { client.Disconnect(context.WithoutCancel(ctx)) }
	names, err := client.Database(db).ListCollectionNames(ctx, bson.D{{Key: "name", Value: name}})
	if err != nil {
		closeClient()
		return nil, nil, fmt.Errorf("mongo: listing the collections of %q: %w", db, err)
	}
	if len(names) == 0 {
		closeClient()
		return nil, nil, usage("mongo: no collection %q in database %q: give the service's with -mongo-database and -mongo-collection", name, db)
	}
	s, err := idemmongo.New(client.Database(db).Collection(name), &idemmongo.Options{SkipIndex: true})
	if err != nil {
		closeClient()
		return nil, nil, usageError{err}
	}
	return s, closeClient, nil
}

// usageError is an error of the flags: idemctl exits with exitUsage.
type usageError struct{ error }

func (e usageError) Unwrap() error { return e.error }

// usage marks err as an error of the flags.
func usage(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// hint adds to a store's error what to check in idemctl's own flags.
func hint(err error) string {
	if errors.Is(err, postgres.ErrNotMigrated) {
		return "idemctl: hint: the table is not there: give the service's with -table (and -schema), as its postgres.Options; idemctl creates nothing"
	}
	return ""
}
