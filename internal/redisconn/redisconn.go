// Package redisconn turns LLMQ_REDIS_URL into Redis clients: one node
// (redis://, rediss://), a Sentinel group (redis+sentinel://) or a Cluster
// (redis+cluster://). Every part of llmq connects through it.
//
// The forms:
//
//	redis://[user:pass@]host:port[/db][?options]
//	rediss://…                                   (TLS)
//	redis+sentinel://[user:pass@]host:port[,host:port…]/MASTER_NAME[/db][?sentinel_password=…&sentinel_username=…&options]
//	redis+cluster://[user:pass@]host:port[,host:port…][?options]
//
// rediss+sentinel:// and rediss+cluster:// are the same over TLS. The user
// and password are the Redis nodes' own; a Sentinel's own credentials go in
// sentinel_username and sentinel_password. Options are go-redis's
// (dial_timeout, read_timeout, pool_size, max_retries, …).
package redisconn

import (
	"cmp"
	"crypto/tls"
	"fmt"
	"maps"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Kind is the shape of the Redis deployment a URL names.
type Kind string

const (
	// Single is one Redis node.
	Single Kind = "single"
	// Sentinel is a master found through a group of sentinels, followed
	// across failovers.
	Sentinel Kind = "sentinel"
	// Cluster is a Redis Cluster, commands routed by slot.
	Cluster Kind = "cluster"
)

// Options is a parsed LLMQ_REDIS_URL. Exactly one of its option sets is
// non-nil, the one of Kind.
type Options struct {
	Kind     Kind
	single   *redis.Options
	failover *redis.FailoverOptions
	cluster  *redis.ClusterOptions
}

// Error is a URL that cannot be used, and why; its text never holds the
// URL's password.
type Error struct{ Reason string }

func (e *Error) Error() string { return e.Reason }

func errorf(format string, args ...any) error { return &Error{Reason: fmt.Sprintf(format, args...)} }

// Parse reads a Redis URL in one of the package's forms.
func Parse(raw string) (Options, error) {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return Options{}, errorf("not a URL: want redis://host:port/db, redis+sentinel://host:port,host:port/master or redis+cluster://host:port,host:port")
	}
	base, topology, _ := strings.Cut(strings.ToLower(scheme), "+")
	switch {
	case base != "redis" && base != "rediss":
	case topology == "":
		return parseSingle(raw)
	case topology == "sentinel":
		return parseSentinel(base, rest)
	case topology == "cluster":
		return parseCluster(base, rest)
	}
	return Options{}, errorf("scheme must be redis, rediss, redis+sentinel or redis+cluster, got %q", scheme)
}

func parseSingle(raw string) (Options, error) {
	u, err := url.Parse(raw)
	if err != nil {
		if ue, ok := err.(*url.Error); ok {
			err = ue.Err
		}
		return Options{}, errorf("not a valid URL: %v", err)
	}
	if u.Hostname() == "" {
		return Options{}, errorf("must name a host, as in redis://127.0.0.1:6379/0")
	}
	o, err := redis.ParseURL(raw)
	if err != nil {
		return Options{}, goRedisError(err)
	}
	return Options{Kind: Single, single: o}, nil
}

type multiHost struct {
	user     *url.Userinfo
	addrs    []string
	path     []string // non-empty path segments
	rawQuery string
}

func splitMultiHost(rest string) (multiHost, error) {
	var m multiHost
	rest, m.rawQuery, _ = strings.Cut(rest, "?")
	hosts, path, _ := strings.Cut(rest, "/")
	if at := strings.LastIndex(hosts, "@"); at >= 0 {
		u, err := url.Parse("redis://" + hosts[:at+1] + "host")
		if err != nil {
			return m, errorf("the user and password are not valid in a URL (escape them)")
		}
		m.user, hosts = u.User, hosts[at+1:]
	}
	for _, h := range strings.Split(hosts, ",") {
		if h == "" {
			return m, errorf("empty address in the host list")
		}
		host, port, err := net.SplitHostPort(h)
		if err != nil {
			host, port = h, "6379"
		}
		if host == "" {
			return m, errorf("address %q has no host", h)
		}
		if n, err := strconv.Atoi(port); err != nil || n <= 0 || n > 65535 {
			return m, errorf("address %q has no valid port", h)
		}
		m.addrs = append(m.addrs, net.JoinHostPort(host, port))
	}
	for _, p := range strings.Split(path, "/") {
		if p != "" {
			m.path = append(m.path, p)
		}
	}
	return m, nil
}

// optionsURL is a go-redis URL of every address of m carrying its options
// but drop.
func (m multiHost) optionsURL(base string, drop ...string) (string, url.Values, error) {
	q, err := url.ParseQuery(m.rawQuery)
	if err != nil {
		return "", nil, errorf("options: %v", err)
	}
	kept := maps.Clone(q)
	for _, d := range drop {
		delete(kept, d)
	}
	kept["addr"] = append(kept["addr"], m.addrs[1:]...)
	return base + "://" + m.addrs[0] + "?" + kept.Encode(), q, nil
}

func parseSentinel(base, rest string) (Options, error) {
	m, err := splitMultiHost(rest)
	if err != nil {
		return Options{}, err
	}
	if len(m.path) == 0 {
		return Options{}, errorf("must name the master after the sentinels, as in redis+sentinel://127.0.0.1:26379,127.0.0.1:26380/mymaster")
	}
	if len(m.path) > 2 {
		return Options{}, errorf("path must be /MASTER_NAME or /MASTER_NAME/db, got %d parts", len(m.path))
	}
	db := 0
	if len(m.path) == 2 {
		if db, err = strconv.Atoi(m.path[1]); err != nil || db < 0 {
			return Options{}, errorf("database number %q is not a number", m.path[1])
		}
	}
	master, err := url.PathUnescape(m.path[0])
	if err != nil {
		return Options{}, errorf("master name %q is not valid", m.path[0])
	}
	// The nodes' own credentials are set after: this URL's are the sentinels'.
	ou, q, err := m.optionsURL(base, "sentinel_password", "sentinel_username")
	if err != nil {
		return Options{}, err
	}
	extra := url.Values{"master_name": {master}, "db": {strconv.Itoa(db)}}
	fo, err := redis.ParseFailoverURL(ou + "&" + extra.Encode())
	if err != nil {
		return Options{}, goRedisError(err)
	}
	fo.SentinelUsername, fo.SentinelPassword = q.Get("sentinel_username"), q.Get("sentinel_password")
	if m.user != nil { // else the username and password options hold
		fo.Username = m.user.Username()
		fo.Password, _ = m.user.Password()
	}
	return Options{Kind: Sentinel, failover: fo}, nil
}

func parseCluster(base, rest string) (Options, error) {
	m, err := splitMultiHost(rest)
	if err != nil {
		return Options{}, err
	}
	if len(m.path) > 1 || (len(m.path) == 1 && m.path[0] != "0") {
		return Options{}, errorf("a cluster has only database 0; drop the path %q", "/"+strings.Join(m.path, "/"))
	}
	ou, _, err := m.optionsURL(base)
	if err != nil {
		return Options{}, err
	}
	co, err := redis.ParseClusterURL(ou)
	if err != nil {
		return Options{}, goRedisError(err)
	}
	co.Username = m.user.Username()
	co.Password, _ = m.user.Password()
	if base == "rediss" {
		host, _, _ := net.SplitHostPort(m.addrs[0])
		co.TLSConfig = &tls.Config{ServerName: host, MinVersion: tls.VersionTLS12}
	}
	// A crashed master sends no MOVED: reload the slot map often.
	co.ClusterStateReloadInterval = cmp.Or(co.ClusterStateReloadInterval, 2*time.Second)
	return Options{Kind: Cluster, cluster: co}, nil
}

func goRedisError(err error) error {
	return errorf("%s", strings.TrimPrefix(err.Error(), "redis: "))
}

// NewClient returns a new client (its own connection pool) of the Redis o
// names. The caller closes it.
func (o Options) NewClient() redis.UniversalClient {
	switch o.Kind {
	case Sentinel:
		c := *o.failover
		return redis.NewFailoverClient(&c)
	case Cluster:
		c := *o.cluster
		return redis.NewClusterClient(&c)
	default:
		c := *o.single
		return redis.NewClient(&c)
	}
}

// AsynqConnOpt is o as asynq's RedisConnOpt (for asynqmon).
func (o Options) AsynqConnOpt() ConnOpt { return ConnOpt{o: o} }

// ConnOpt implements asynq.RedisConnOpt.
type ConnOpt struct{ o Options }

// MakeRedisClient returns a new redis.UniversalClient.
func (c ConnOpt) MakeRedisClient() any { return c.o.NewClient() }
