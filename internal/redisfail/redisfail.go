// Package redisfail tells an error that means Redis cannot serve right now
// (it does not answer, the connection broke, or it is between roles: still
// loading its data, a replica during a failover, a cluster without a
// majority) from an error about the command itself. The first kind ends by
// itself when Redis is back, so callers answer it with "try again shortly"
// (the API's 503 with Retry-After) rather than as a failure of llmq.
package redisfail

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/redis/go-redis/v9"
)

// Unavailable reports whether err, from a go-redis call, means that Redis
// cannot serve now: a network error or a closed connection, no connection
// free in the pool, a deadline that ran out while waiting for Redis, or one
// of the replies Redis gives while it cannot take commands.
//
// A network error names no server: call Unavailable on the errors of Redis
// calls, or rule out those of other services first (the API does so with
// the database's connection errors).
func Unavailable(err error) bool {
	if err == nil {
		return false
	}
	if redis.IsLoadingError(err) || redis.IsReadOnlyError(err) || redis.IsClusterDownError(err) ||
		redis.IsTryAgainError(err) || redis.IsMasterDownError(err) || redis.IsNoReplicasError(err) ||
		redis.IsMaxClientsError(err) {
		return true
	}
	var rerr redis.Error
	if errors.As(err, &rerr) {
		// Any other reply is Redis answering: about the command, not its
		// availability.
		return false
	}
	if errors.Is(err, redis.ErrPoolTimeout) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) {
		return true
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return true
	}
	// go-redis's own words for a cluster it cannot reach (an unexported
	// error, so matched by its text).
	return strings.Contains(err.Error(), "redis: cluster has no nodes")
}
