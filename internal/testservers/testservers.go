// Package testservers starts throwaway servers for the repository's tests
// in Docker containers, with github.com/ory/dockertest/v3, so that a
// contributor with Docker can run every backend's tests without installing
// servers: MongoDB (mongo:7 as a single-member replica set, so change
// streams work), PostgreSQL, Redis and etcd.
//
// It lives in a test-only module that is never tagged or published: no
// published go.mod gets dockertest and its dependencies. The tests use it
// through the command in cmd/testserver, which the scripts under
// scripts/servers run (scripts/servers/mongo.sh for MongoDB): it prints
// the "export VAR=..." lines that point the tests at the server, as the
// other server scripts do.
//
// Every container listens on a random port of 127.0.0.1 only, carries
// the label [Label] (so that `docker rm -f $(docker ps -aq --filter
// label=idem-testservers)` removes any left behind), and is removed with
// [Server.Close] or [Remove].
package testservers

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/ory/dockertest/v3"
	dc "github.com/ory/dockertest/v3/docker"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// Label marks the containers this package starts.
const Label = "idem-testservers"

// ErrNoDaemon is wrapped by [Daemon] (and so by [Start]) when no Docker
// daemon answers. dockertest.NewPool succeeds without one; a ping is what
// fails.
var ErrNoDaemon = errors.New("no Docker daemon answers")

// Daemon returns a pool on the Docker daemon of the environment
// (DOCKER_HOST, or the platform's default socket), or an error wrapping
// ErrNoDaemon that says where it looked and why it failed.
func Daemon() (*dockertest.Pool, error) {
	pool, err := dockertest.NewPool("")
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoDaemon, err)
	}
	if err := pool.Client.Ping(); err != nil {
		where := os.Getenv("DOCKER_HOST")
		if where == "" {
			where = "the default socket"
		}
		return nil, fmt.Errorf("%w at %s (DOCKER_HOST): %v", ErrNoDaemon, where, err)
	}
	return pool, nil
}

// Spec describes a server image.
type Spec struct {
	// Repository and Tag name the image.
	Repository, Tag string
	// Cmd and Env are the container's command arguments and environment.
	Cmd, Env []string
	// Port is the container port the tests connect to, e.g. "27017/tcp".
	Port string
	// Ready returns nil once the server at hostPort accepts work, doing
	// any initialisation it needs (it is retried until then).
	Ready func(ctx context.Context, r *dockertest.Resource, hostPort string) error
	// Exports returns the variables that point the tests at hostPort.
	Exports func(hostPort string) map[string]string
}

// Specs are the servers this package knows, by name.
var Specs = map[string]Spec{
	"mongo": {
		Repository: "mongo", Tag: "7",
		// A single-member replica set: change streams, majority writes and
		// causally consistent sessions behave as in production.
		Cmd:   []string{"--replSet", "rs0", "--bind_ip_all"},
		Port:  "27017/tcp",
		Ready: mongoReady,
		Exports: func(hp string) map[string]string {
			return map[string]string{"IDEM_MONGO_URI": "mongodb://" + hp + "/?directConnection=true"}
		},
	},
	"postgres": {
		Repository: "postgres", Tag: "15",
		Env:  []string{"POSTGRES_HOST_AUTH_METHOD=trust", "POSTGRES_DB=idem"},
		Cmd:  []string{"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"},
		Port: "5432/tcp",
		Ready: func(ctx context.Context, r *dockertest.Resource, hp string) error {
			code, err := r.Exec([]string{"pg_isready", "-q", "-h", "127.0.0.1", "-d", "idem", "-U", "postgres"}, dockertest.ExecOptions{})
			if err == nil && code != 0 {
				err = fmt.Errorf("pg_isready exited with %d", code)
			}
			return err
		},
		Exports: func(hp string) map[string]string {
			return map[string]string{"IDEM_POSTGRES_URL": "postgres://postgres@" + hp + "/idem?sslmode=disable"}
		},
	},
	"redis": {
		Repository: "redis", Tag: "7",
		Cmd:   []string{"redis-server", "--save", "", "--appendonly", "no"},
		Port:  "6379/tcp",
		Ready: redisReady,
		Exports: func(hp string) map[string]string {
			return map[string]string{"IDEM_REDIS_ADDR": hp}
		},
	},
	"etcd": {
		Repository: "quay.io/coreos/etcd", Tag: "v3.6.16", // the client's version
		Cmd: []string{"etcd", "--data-dir", "/tmp/etcd", "--listen-client-urls", "http://0.0.0.0:2379",
			"--advertise-client-urls", "http://127.0.0.1:2379", "--unsafe-no-fsync"},
		Port:  "2379/tcp",
		Ready: httpReady("/health", `"health":"true"`),
		Exports: func(hp string) map[string]string {
			return map[string]string{"IDEM_ETCD_ENDPOINTS": hp}
		},
	},
}

// Names lists the known servers.
func Names() []string {
	var names []string
	for n := range Specs {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Server is a running container.
type Server struct {
	// ID is the container's ID.
	ID string
	// Exports are the variables that point the tests at the server.
	Exports map[string]string

	pool     *dockertest.Pool
	resource *dockertest.Resource
}

// Start starts the server name in a container and waits until it is
// ready, within wait (pulling the image may take most of it). On any error
// after the container started, the container is removed.
func Start(name string, wait time.Duration) (*Server, error) {
	spec, ok := Specs[name]
	if !ok {
		return nil, fmt.Errorf("testservers: unknown server %q (known: %s)", name, strings.Join(Names(), ", "))
	}
	pool, err := Daemon()
	if err != nil {
		return nil, err
	}
	pool.MaxWait = wait
	r, err := pool.RunWithOptions(&dockertest.RunOptions{
		Repository:   spec.Repository,
		Tag:          spec.Tag,
		Cmd:          spec.Cmd,
		Env:          spec.Env,
		ExposedPorts: []string{spec.Port},
		PortBindings: map[dc.Port][]dc.PortBinding{dc.Port(spec.Port): {{HostIP: "127.0.0.1", HostPort: ""}}},
		Labels:       map[string]string{Label: name},
	}, func(hc *dc.HostConfig) {
		hc.AutoRemove = true
		hc.RestartPolicy = dc.RestartPolicy{Name: "no"}
	})
	if err != nil {
		return nil, fmt.Errorf("testservers: starting %s:%s: %w", spec.Repository, spec.Tag, err)
	}
	hp := hostPort(r, spec.Port)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	err = pool.Retry(func() error {
		actx, acancel := context.WithTimeout(ctx, 10*time.Second)
		defer acancel()
		return spec.Ready(actx, r, hp)
	})
	if err != nil {
		_ = pool.Purge(r)
		return nil, fmt.Errorf("testservers: %s at %s not ready within %v: %w", name, hp, wait, err)
	}
	return &Server{ID: r.Container.ID, Exports: spec.Exports(hp), pool: pool, resource: r}, nil
}

// hostPort is the loopback address of the container's port.
func hostPort(r *dockertest.Resource, port string) string {
	return net.JoinHostPort("127.0.0.1", r.GetPort(port))
}

// Close removes the container.
func (s *Server) Close() error { return s.pool.Purge(s.resource) }

// Remove removes the container with the given ID, as [Server.Close] does
// from another process. A container already gone is no error.
func Remove(id string) error {
	pool, err := Daemon()
	if err != nil {
		return err
	}
	err = pool.Client.RemoveContainer(dc.RemoveContainerOptions{ID: id, Force: true, RemoveVolumes: true})
	var missing *dc.NoSuchContainer
	if errors.As(err, &missing) {
		return nil
	}
	return err
}

// mongoReady initiates the replica set once mongod answers, and waits
// until its one member is primary. The member's host is localhost:27017,
// as mongod sees itself; clients connect directly (directConnection=true)
// to the published port.
func mongoReady(ctx context.Context, _ *dockertest.Resource, hp string) error {
	client, err := mongo.Connect(options.Client().ApplyURI("mongodb://" + hp + "/?directConnection=true").SetServerSelectionTimeout(5 * time.Second))
	if err != nil {
		return err
	}
	defer client.Disconnect(context.Background())
	admin := client.Database("admin")
	hello, err := admin.RunCommand(ctx, bson.D{{Key: "hello", Value: 1}}).Raw()
	if err != nil {
		return err
	}
	if primary, _ := hello.Lookup("isWritablePrimary").BooleanOK(); primary {
		return nil
	}
	if _, inSet := hello.Lookup("setName").StringValueOK(); !inSet {
		err := admin.RunCommand(ctx, bson.D{{Key: "replSetInitiate", Value: bson.D{
			{Key: "_id", Value: "rs0"},
			{Key: "members", Value: bson.A{bson.D{{Key: "_id", Value: 0}, {Key: "host", Value: "localhost:27017"}}}},
		}}}).Err()
		var ce mongo.CommandError
		if err != nil && !(errors.As(err, &ce) && ce.Name == "AlreadyInitialized") {
			return fmt.Errorf("replSetInitiate: %w", err)
		}
	}
	return errors.New("the replica set has no primary yet")
}

// redisReady sends PING in the inline protocol.
func redisReady(ctx context.Context, _ *dockertest.Resource, hp string) error {
	return lineProtocol(ctx, hp, "PING\r\n", "+PONG")
}

// httpReady checks that GET path answers with a body holding want.
func httpReady(path, want string) func(context.Context, *dockertest.Resource, string) error {
	return func(ctx context.Context, _ *dockertest.Resource, hp string) error {
		return lineProtocol(ctx, hp, "GET "+path+" HTTP/1.0\r\nHost: "+hp+"\r\n\r\n", want)
	}
}

// lineProtocol sends req and succeeds when a line of the reply holds want.
func lineProtocol(ctx context.Context, hp, req, want string) error {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", hp)
	if err != nil {
		return err
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	if _, err := conn.Write([]byte(req)); err != nil {
		return err
	}
	sc := bufio.NewScanner(conn)
	for sc.Scan() {
		if strings.Contains(sc.Text(), want) {
			return nil
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	return fmt.Errorf("no %q in the reply", want)
}
