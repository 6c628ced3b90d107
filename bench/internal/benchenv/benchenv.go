// Package benchenv holds what the benchmark programs under bench/ share:
// their main and their servers' flags (cli.go), the run's Redis database,
// the environment of the llmq they start (the same variables a deployment
// sets, with a namespace of the run's own), its tenants, and the undoing of
// a setup.
package benchenv

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/client"
)

// AdminToken guards the admin API of the llmq a run starts, which only the
// run reaches.
const AdminToken = "bench-admin-token-0123456789"

// Redis returns a client of database db of the server at rawURL (the
// -redis flag's value), once it answers, and that URL with the database
// number replaced, for the processes the run starts.
func Redis(ctx context.Context, rawURL string, db int) (*redis.Client, string, error) {
	opt, err := redis.ParseURL(rawURL)
	if err != nil {
		return nil, "", fmt.Errorf("-redis: %w", err)
	}
	opt.DB = db
	c := redis.NewClient(opt)
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := c.Ping(pctx).Err(); err != nil {
		_ = c.Close()
		return nil, "", fmt.Errorf("redis at %s does not answer: %w", opt.Addr, err)
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		_ = c.Close()
		return nil, "", fmt.Errorf("-redis: %w", err)
	}
	u.Path = "/" + strconv.Itoa(db)
	return c, u.String(), nil
}

// Environ is the environment of an llmq a run starts.
type Environ struct {
	RedisURL, DatabaseURL, PolicyPath string
	// Namespace is the run's key prefix and queue namespace.
	Namespace       string
	Concurrency     int
	ShutdownTimeout time.Duration
	// Extra are more NAME=value pairs, after the others.
	Extra []string
}

// List returns the environment as NAME=value pairs: Redis, Postgres, the
// policy, the admin token, the namespace, listeners on loopback ports the
// system picks (so several processes run on one host), the workers'
// concurrency and shutdown timeout, and the simulator's key.
func (e Environ) List() []string {
	return append([]string{
		"LLMQ_REDIS_URL=" + e.RedisURL,
		"LLMQ_DATABASE_URL=" + e.DatabaseURL,
		"LLMQ_POLICY=" + e.PolicyPath,
		"LLMQ_ADMIN_TOKEN=" + AdminToken,
		"LLMQ_KEY_PREFIX=" + e.Namespace,
		"LLMQ_QUEUE_NAMESPACE=" + e.Namespace,
		"LLMQ_LISTEN_ADDR=127.0.0.1:0",
		"LLMQ_METRICS_ADDR=127.0.0.1:0",
		"LLMQ_WORKER_CONCURRENCY=" + strconv.Itoa(e.Concurrency),
		"LLMQ_SHUTDOWN_TIMEOUT=" + e.ShutdownTimeout.String(),
		"SIM_API_KEY=bench",
	}, e.Extra...)
}

// WritePolicy writes policy.yaml into dir from tmpl, its {{SIM}}, {{RPM}}
// and {{TPM}} replaced by the simulator's base URL and the limits, and
// returns the file's path.
func WritePolicy(dir, tmpl, simURL string, rpm, tpm int64) (string, error) {
	policy := strings.NewReplacer("{{SIM}}", simURL, "{{RPM}}", strconv.FormatInt(rpm, 10),
		"{{TPM}}", strconv.FormatInt(tpm, 10)).Replace(tmpl)
	path := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(path, []byte(policy), 0o600); err != nil {
		return "", err
	}
	return path, nil
}

// Tenant makes a tenant of tier with a key through admin (a client of an
// llmq's admin API), and returns the tenant's id, the key and a client of
// that key at the same llmq, made with opts.
func Tenant(ctx context.Context, admin *client.Client, name, tier string, opts ...client.Option) (id, key string, c *client.Client, err error) {
	t, err := admin.Admin.CreateTenant(ctx, &client.TenantCreateParams{Name: name, Tier: tier})
	if err != nil {
		return "", "", nil, err
	}
	k, err := admin.Admin.CreateKey(ctx, t.ID)
	if err != nil {
		return "", "", nil, err
	}
	c, err = client.New(admin.BaseURL(), k.Key, opts...)
	return t.ID, k.Key, c, err
}

// Closers undo a setup, one function a step, in the order the steps were
// done: append each step's undoing as it succeeds.
type Closers []func()

// Close runs the closers, the last appended first, and forgets them.
func (c *Closers) Close() {
	for i := len(*c) - 1; i >= 0; i-- {
		(*c)[i]()
	}
	*c = nil
}
