package outbox

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
)

// Timings of a relay's listener.
const (
	// listenConnectTimeout bounds one attempt to connect and LISTEN.
	listenConnectTimeout = 10 * time.Second
	// listenBackoffMin and listenBackoffMax bound the pause between
	// attempts to connect after a failure.
	listenBackoffMin = 50 * time.Millisecond
	listenBackoffMax = 5 * time.Second
)

// listen holds the relay's LISTEN connection while ctx is live, and wakes
// the relay (a non-blocking send on wake) on every notification, and
// after every (re)connection, since notifications sent while it was not
// listening are lost. When the connection fails it reconnects with a
// growing pause; meanwhile the relay polls. A connection that dies without
// the client noticing (no TCP reset) is only found by TCP keepalive; the
// relay polls until then too.
func (r *Relay) listen(ctx context.Context, wake chan<- struct{}) {
	signal := func() {
		select {
		case wake <- struct{}{}:
		default: // a wake-up is pending already
		}
	}
	pause := listenBackoffMin
	for {
		conn, err := r.dialListen(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			r.log.Warn("outbox relay: cannot LISTEN; polling meanwhile", "table", r.t.names.Table, "pause", pause, "err", err)
			if !sleep(ctx, pause, nil) {
				return
			}
			pause = min(2*pause, listenBackoffMax)
			continue
		}
		pause = listenBackoffMin
		signal()
		for {
			if _, err = conn.WaitForNotification(ctx); err != nil {
				break
			}
			signal()
		}
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = conn.Close(cctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		r.log.Warn("outbox relay: lost the LISTEN connection; reconnecting", "table", r.t.names.Table, "err", err)
	}
}

// dialListen opens a connection and LISTENs on the table's channel.
func (r *Relay) dialListen(ctx context.Context) (*pgx.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, listenConnectTimeout)
	defer cancel()
	conn, err := r.connect(ctx)
	if err != nil {
		return nil, err
	}
	if conn == nil {
		return nil, errors.New("outbox: RelayOptions.ListenConnect returned a nil connection")
	}
	if _, err := conn.Exec(ctx, `LISTEN "`+r.t.channel+`"`); err != nil {
		cctx, ccancel := context.WithTimeout(context.Background(), time.Second)
		_ = conn.Close(cctx)
		ccancel()
		return nil, err
	}
	return conn, nil
}
