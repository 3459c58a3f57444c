package postgres

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/arbiter-hq/arbiter"
)

// The roster of replicas (arbiter.Roster; table replicas, migration 0005):
// each replica of a highly available deployment keeps a row, refreshed at
// every renewal, so every replica can show who else is there, followers
// find the leader's spalloc address, and a second process started with a
// node id that is in use is refused.

var _ arbiter.Roster = (*Store)(nil)

const (
	// joinReplica takes the row of a node id that is free, stale (not
	// seen for $9 ms) or held by instance $10 (a process known to be gone).
	joinReplica = `INSERT INTO replicas AS r (node_id, instance, url, spalloc, host, pid, version, started_at, seen_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, now(), now())
		ON CONFLICT (node_id) DO UPDATE SET instance = EXCLUDED.instance, url = EXCLUDED.url, spalloc = EXCLUDED.spalloc,
			host = EXCLUDED.host, pid = EXCLUDED.pid, version = EXCLUDED.version, started_at = now(), seen_at = now()
		WHERE r.seen_at < now() - $8 * interval '1 millisecond' OR r.instance = $9 OR r.instance = EXCLUDED.instance
		RETURNING node_id`
	readReplica = `SELECT node_id, instance, url, spalloc, host, pid, version, started_at, seen_at FROM replicas WHERE node_id = $1`
	// beatReplica refreshes our row and lists the live ones, in one
	// statement: the CTE's update is seen by nobody but its count.
	beatReplica = `WITH beat AS (
			UPDATE replicas SET seen_at = now() WHERE node_id = $1 AND instance = $2 RETURNING node_id
		)
		SELECT (SELECT count(*) FROM beat), node_id, instance, url, spalloc, host, pid, version, started_at,
			CASE WHEN node_id = $1 AND instance = $2 THEN now() ELSE seen_at END
		FROM replicas WHERE seen_at >= now() - $3 * interval '1 millisecond' OR (node_id = $1 AND instance = $2)
		ORDER BY node_id`
	leaveReplica = `DELETE FROM replicas WHERE node_id = $1 AND instance = $2`
)

// JoinReplicas adds r to the roster, or takes over the row of r.ID when it
// was not refreshed for ttl, or belongs to a process of this host that is
// gone. Errors: conflict naming the live replica that has r.ID.
func (s *Store) JoinReplicas(ctx context.Context, r arbiter.Replica, ttl time.Duration) error {
	if err := s.join(ctx, r, ttl); err != nil {
		return fmt.Errorf("postgres: join the replicas: %w", normalize(err))
	}
	return nil
}

func (s *Store) join(ctx context.Context, r arbiter.Replica, ttl time.Duration) error {
	take := func(gone string) (bool, error) {
		var id string
		err := s.pool.QueryRow(ctx, joinReplica, r.ID, r.Instance, r.URL, r.Spalloc, r.Host, r.PID, r.Version,
			ttl.Milliseconds(), gone).Scan(&id)
		if errors.Is(err, pgx.ErrNoRows) {
			return false, nil
		}
		return err == nil, err
	}
	ok, err := take("")
	if err != nil || ok {
		return err
	}
	held, err := scanReplica(s.pool.QueryRow(ctx, readReplica, r.ID))
	if err != nil {
		return err
	}
	// Its process on this host is gone (kill -9, then a restart): no need
	// to wait for its row to go stale.
	host, _ := os.Hostname()
	if held.Host == host && held.PID > 0 && held.PID != os.Getpid() && !processAlive(held.PID) {
		if ok, err = take(held.Instance); err != nil || ok {
			return err
		}
	}
	return arbiter.Errorf(arbiter.EConflict, "node_id %q is in use by a running replica (pid %d on host %s, %s, seen %s ago): "+
		"give every replica its own [ha] node_id, or stop the other one",
		arbiter.EscapeText(r.ID, false), held.PID, arbiter.EscapeText(held.Host, false), arbiter.EscapeText(held.URL, false),
		time.Since(held.Seen).Round(time.Millisecond))
}

// BeatReplica refreshes r's row and returns the replicas seen within ttl,
// r among them, in id order. Errors: conflict when r.ID's row now belongs
// to another instance.
func (s *Store) BeatReplica(ctx context.Context, r arbiter.Replica, ttl time.Duration) ([]arbiter.Replica, error) {
	rows, err := s.pool.Query(ctx, beatReplica, r.ID, r.Instance, ttl.Milliseconds())
	if err != nil {
		return nil, fmt.Errorf("postgres: beat: %w", normalize(err))
	}
	defer rows.Close()
	var out []arbiter.Replica
	beat := int64(0)
	for rows.Next() {
		var x arbiter.Replica
		if err := rows.Scan(&beat, &x.ID, &x.Instance, &x.URL, &x.Spalloc, &x.Host, &x.PID, &x.Version, &x.Started, &x.Seen); err != nil {
			return nil, fmt.Errorf("postgres: beat: %w", normalize(err))
		}
		out = append(out, x)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("postgres: beat: %w", normalize(err))
	}
	if beat == 0 {
		return out, arbiter.Errorf(arbiter.EConflict, "node_id %q was taken over by another process while this one did not refresh it: "+
			"two replicas run with one [ha] node_id", arbiter.EscapeText(r.ID, false))
	}
	return out, nil
}

// LeaveReplicas removes r's row, if it is still r's.
func (s *Store) LeaveReplicas(ctx context.Context, r arbiter.Replica) error {
	if _, err := s.pool.Exec(ctx, leaveReplica, r.ID, r.Instance); err != nil {
		return fmt.Errorf("postgres: leave the replicas: %w", normalize(err))
	}
	return nil
}

func scanReplica(row pgx.Row) (arbiter.Replica, error) {
	var x arbiter.Replica
	err := row.Scan(&x.ID, &x.Instance, &x.URL, &x.Spalloc, &x.Host, &x.PID, &x.Version, &x.Started, &x.Seen)
	return x, err
}
