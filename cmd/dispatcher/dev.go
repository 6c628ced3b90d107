package main

import (
	"cmp"
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/llmq/llmq/internal/api"
	"github.com/llmq/llmq/internal/app"
	"github.com/llmq/llmq/internal/budget"
	"github.com/llmq/llmq/internal/cmdline"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/llm/sim"
	"github.com/llmq/llmq/internal/recovery"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/worker"
)

//go:embed dev-policy.yaml
var devPolicy string

const devUsage = `usage: dispatcher dev [FLAGS]
  Runs all of llmq in one process, with nothing installed but Go: an
  embedded Redis (its state saved under -dir), SQLite under -dir, the
  simulated provider (or a real one with -provider-url), a worker, the API,
  the dashboard and /monitoring/. It prints the URL, a tenant's key and the
  admin token, with lines to paste. LLMQ_* variables that are set are used
  (dispatcher serve -h lists them): LLMQ_REDIS_URL and LLMQ_DATABASE_URL
  replace the embedded Redis and SQLite, LLMQ_LISTEN_ADDR is -addr's default.

Flags:
`

// devAddr is dev's default address: loopback, as its tenant key is known.
const devAddr = "127.0.0.1:8080"

type devOptions struct {
	dir         string
	addr        string
	demo        int
	providerURL string
	providerKey string
	concurrency int
}

func parseDev(args, environ []string, stdout io.Writer) (*devOptions, error) {
	o := &devOptions{}
	addr, _ := app.LookupIn(environ)("LLMQ_LISTEN_ADDR")
	fs := flag.NewFlagSet("dev", flag.ContinueOnError)
	fs.StringVar(&o.dir, "dir", "llmq-dev", "where the state lives (SQLite database, embedded Redis snapshot, tenant key, admin token)")
	fs.StringVar(&o.addr, "addr", cmp.Or(addr, devAddr), "address of the API, dashboard and simulated provider (default: LLMQ_LISTEN_ADDR, else "+devAddr+")")
	fs.IntVar(&o.demo, "demo", 0, "submit this many sample jobs and a small batch, so the dashboard moves")
	fs.StringVar(&o.providerURL, "provider-url", "", "OpenAI-compatible base URL of a real provider (default: the simulator)")
	fs.StringVar(&o.providerKey, "provider-key-env", "OPENAI_API_KEY", "environment variable holding the real provider's API key")
	fs.IntVar(&o.concurrency, "concurrency", 10, "jobs the embedded worker runs at once")
	var help strings.Builder
	help.WriteString(devUsage)
	fs.SetOutput(&help)
	fs.PrintDefaults()
	if err := cmdline.Parse(fs, args, stdout, help.String()); err != nil {
		return nil, err
	}
	if o.demo < 0 {
		return nil, cmdline.Usagef("-demo must be 0 or more, got %d", o.demo)
	}
	if o.concurrency < 1 {
		return nil, cmdline.Usagef("-concurrency must be at least 1, got %d", o.concurrency)
	}
	if o.providerURL != "" && !strings.HasPrefix(o.providerURL, "http://") && !strings.HasPrefix(o.providerURL, "https://") {
		return nil, cmdline.Usagef("-provider-url must be an http(s) URL, got %q", o.providerURL)
	}
	return o, nil
}

// dev runs the embedded default until ctx ends.
func dev(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	o, err := parseDev(args, environ, stdout)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(o.dir, 0o700); err != nil {
		return fmt.Errorf("-dir: %w", err)
	}
	ln, err := net.Listen("tcp", o.addr)
	if err != nil {
		return fmt.Errorf("-addr: %w (is another llmq running? pick another with -addr)", err)
	}
	defer ln.Close()
	base := "http://" + ln.Addr().String()

	lookup := app.LookupIn(environ)
	env, err := devEnv(o, environ, base)
	if err != nil {
		return err
	}
	logger := env.Logger(stderr)

	if _, set := lookup("LLMQ_REDIS_URL"); !set {
		mr, err := startDevRedis(filepath.Join(o.dir, "redis.json"), logger)
		if err != nil {
			return err
		}
		defer mr.stop() // last: after the worker and the server stopped
		defer app.Background(ctx, mr.run)()
		env.RedisURL = "redis://" + mr.Addr() + "/0"
	}

	providerKeyEnv := "LLMQ_DEV_SIM_KEY"
	providerURL := base + "/sim/v1"
	var so serveOptions
	if o.providerURL != "" {
		providerURL, providerKeyEnv = strings.TrimSuffix(o.providerURL, "/"), o.providerKey
		if k, ok := lookup(providerKeyEnv); !ok || k == "" {
			return fmt.Errorf("-provider-url needs the provider's API key in %s", providerKeyEnv)
		}
	} else {
		// The simulator shares the API's address: a key made at each start
		// and random ids keep everyone but llmq out of it.
		key, err := devSecret(filepath.Join(o.dir, devSimKeyFile), "sk-llmq-dev-", 24, false)
		if err != nil {
			return fmt.Errorf("-dir: %w", err)
		}
		simulator := sim.New(sim.Config{Limits: sim.Limits{RPM: 500, TPM: 200000}, DefaultMaxTokens: 1024,
			Latency: 300 * time.Millisecond, Jitter: 700 * time.Millisecond, APIKey: key, RandomIDs: true})
		defer simulator.Close()
		so.mount = func(mux *http.ServeMux) { mux.Handle("/sim/", http.StripPrefix("/sim", simulator.Handler())) }
		// The simulator needs no pause after the "loss" at every start.
		so.reconciler.LossPause = -1
		lookup = app.LookupIn(append(slices.Clip(environ), providerKeyEnv+"="+key))
	}
	policyPath := filepath.Join(o.dir, "policy.yaml")
	policy := strings.NewReplacer("{{BASE_URL}}", providerURL, "{{API_KEY_ENV}}", providerKeyEnv).Replace(devPolicy)
	if err := os.WriteFile(policyPath, []byte(policy), 0o600); err != nil {
		return err
	}
	env.Policy = policyPath

	a, err := app.Open(ctx, env, logger, app.Parts{LookupEnv: lookup, Migrate: true})
	if err != nil {
		return err
	}
	defer a.Close()
	rec, stopRec, err := a.StartRecorder(ctx)
	if err != nil {
		return err
	}
	defer stopRec()

	// A snapshot older than the ledger holds less spend than was charged,
	// and miniredis has no run id by which a day notices it.
	if _, err := a.Reconciler(recovery.Options{}).CheckBudgets(ctx, budget.RaisedRestored); err != nil {
		return fmt.Errorf("check the budgets against the ledger: %w", err)
	}

	srv, handlers, err := a.WorkerServer(worker.Options{})
	if err != nil {
		return err
	}
	if err := srv.Start(handlers); err != nil {
		return fmt.Errorf("start the embedded worker: %w", err)
	}
	defer srv.Shutdown()

	tenantID, key, err := devTenant(ctx, a, o.dir)
	if err != nil {
		return err
	}
	if o.demo > 0 {
		go runDemo(ctx, base, key, o.demo, logger)
	}
	banner(stdout, base, env.AdminToken, tenantID, key, o)

	if env.MetricsAddr != "" {
		if so.metrics, err = net.Listen("tcp", env.MetricsAddr); err != nil {
			return fmt.Errorf("LLMQ_METRICS_ADDR: %w", err)
		}
		defer so.metrics.Close()
	}
	return serveApp(ctx, a, rec, ln, logger, so)
}

// devEnv is the environment of the embedded default: the caller's LLMQ_*
// variables where set, else SQLite under dir, text logs, and an admin token
// kept in dir so it survives restarts.
func devEnv(o *devOptions, environ []string, base string) (*config.Env, error) {
	defaults := []string{"LLMQ_DATABASE_URL=sqlite://" + filepath.Join(o.dir, "llmq.db"), "LLMQ_LOG_FORMAT=text", "LLMQ_LOG_LEVEL=warn"}
	if _, ok := app.LookupIn(environ)("LLMQ_ADMIN_TOKEN"); !ok {
		token, err := devSecret(filepath.Join(o.dir, "admin-token"), "dev-admin-", 12, true)
		if err != nil {
			return nil, err
		}
		defaults = append(defaults, "LLMQ_ADMIN_TOKEN="+token)
	}
	// The last of a variable counts: the caller's override the defaults.
	listen := "LLMQ_LISTEN_ADDR=" + strings.TrimPrefix(base, "http://")
	env, err := config.LoadEnv(slices.Concat(defaults, environ, []string{listen}))
	if err != nil {
		return nil, err
	}
	env.WorkerConcurrency = o.concurrency
	if err := env.Validate(config.RoleDev); err != nil {
		return nil, err
	}
	return env, nil
}

// devSimKeyFile holds the simulator's key under dir.
const devSimKeyFile = "sim-key"

// devSecret writes prefix and n random bytes in hex to path and returns
// them; with keep, a secret path already holds is returned instead.
func devSecret(path, prefix string, n int, keep bool) (string, error) {
	if b, err := os.ReadFile(path); keep && err == nil && len(strings.TrimSpace(string(b))) > 0 {
		return strings.TrimSpace(string(b)), nil
	}
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	s := prefix + hex.EncodeToString(b)
	if err := os.WriteFile(path, []byte(s+"\n"), 0o600); err != nil {
		return "", err
	}
	return s, nil
}

// devTenant returns the default tenant and a key of it, made when missing.
func devTenant(ctx context.Context, a *app.App, dir string) (string, string, error) {
	path := filepath.Join(dir, "tenant.json")
	var f struct { // kept across restarts
		TenantID string `json:"tenant_id"`
		Key      string `json:"key"`
	}
	if b, err := os.ReadFile(path); err == nil && json.Unmarshal(b, &f) == nil && f.Key != "" {
		if _, err := a.Store.TenantGetByID(ctx, f.TenantID); err == nil {
			return f.TenantID, f.Key, nil
		} else if !errors.Is(err, store.ErrNotFound) {
			return "", "", err
		}
	}
	t, err := a.Store.TenantInsert(ctx, &store.TenantInsertParams{Name: "dev", Tier: "standard"})
	if err != nil {
		return "", "", fmt.Errorf("create the default tenant: %w", err)
	}
	_, key, err := api.CreateKey(ctx, a.Store, t.ID)
	if err != nil {
		return "", "", err
	}
	f.TenantID, f.Key = t.ID, key
	b, _ := json.MarshalIndent(f, "", "  ")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return "", "", err
	}
	return f.TenantID, f.Key, nil
}

func banner(w io.Writer, base, admin, tenant, key string, o *devOptions) {
	provider := "the simulated provider (" + base + "/sim/v1, its key in " + filepath.Join(o.dir, devSimKeyFile) + ")"
	if o.providerURL != "" {
		provider = o.providerURL
	}
	fmt.Fprintf(w, `llmq is running at %s (state in %s/, provider: %s)

  tenant:      %s (tier standard)
  key:         %s
  admin token: %s
  dashboard:   %s/dashboard  (user: admin, password: %s, the admin token)
  monitoring:  %s/monitoring/  (the same login)

Send a job and read it back:

  curl -s -X POST %s/v1/jobs -H "Authorization: Bearer %s" -d '{"body":{"model":"gpt-4o-mini","messages":[{"role":"user","content":"Say hi"}],"max_tokens":50}}'
  curl -s %s/v1/jobs -H "Authorization: Bearer %s"

Or with the CLI (go build -o bin/ ./cmd/llmq once, then bin/llmq starts at once):

  export LLMQ_URL=%s LLMQ_API_KEY=%s LLMQ_ADMIN_TOKEN=%s
  go run ./cmd/llmq jobs list
  go run ./cmd/llmq usage
  go run ./cmd/llmq admin tenants list

Ctrl-C stops llmq; its state stays in %s/.
`, base, o.dir, provider, tenant, key, admin, base, admin, base, base, key, base, key, base, key, admin, o.dir)
}
