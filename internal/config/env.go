// Package config owns everything an llmq process is told from outside: the
// LLMQ_* environment (addresses, secrets, sizes, logging) and the policy file
// (providers, models with their prices and rate limits, tenant tiers with
// their daily budgets and API limits). It parses both strictly, refuses
// anything invalid with one line naming the variable or field and why, and
// keeps the policy current while the process runs (PolicyHolder).
package config

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caarlos0/env/v11"

	"github.com/llmq/llmq/internal/redisconn"
)

// EnvPrefix starts the name of every environment variable llmq reads.
const EnvPrefix = "LLMQ_"

// Role is the kind of process whose environment is validated.
type Role string

// The roles Env.Validate knows.
const (
	RoleDispatcher Role = "dispatcher" // the HTTP API, the dashboard, /metrics
	RoleWorker     Role = "worker"     // runs jobs from the queues
	RoleDev        Role = "dev"        // both in one process, for local use
)

const minAdminTokenLen = 16

// Env is the process configuration read from LLMQ_* environment variables.
// After Validate every field holds a valid value (stated at each field, or
// by its help).
type Env struct {
	// RedisURL is as redisconn.Parse reads it.
	RedisURL string `env:"REDIS_URL" envDefault:"redis://127.0.0.1:6379/0" help:"Redis: queues, limiter buckets, live spend"`
	// DatabaseURL is postgres://, postgresql://, sqlite:// or file:.
	DatabaseURL string `env:"DATABASE_URL" envDefault:"postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable" help:"the system of record: postgres://… or sqlite://path"`
	// ListenAddr is host:port. Defaults to DefaultListenAddr of the role.
	ListenAddr string `env:"LISTEN_ADDR" help:"HTTP address: the dispatcher's API, the worker's /healthz and /readyz"`
	// MetricsAddr is host:port, not ListenAddr. Defaults to DefaultMetricsAddr.
	MetricsAddr string `env:"METRICS_ADDR" help:"address of the unauthenticated /metrics listener for Prometheus (keep it internal)"`
	// Policy is the path of the policy YAML, not empty. Defaults to llmq.yaml.
	Policy string `env:"POLICY" envDefault:"llmq.yaml" help:"the policy file: providers, models, tiers (llmq.example.yaml is a commented example)"`
	// AdminToken is 16+ characters without spaces; empty only in dev mode.
	AdminToken string `env:"ADMIN_TOKEN" help:"guards /admin/, /dashboard, /monitoring/ (16+ characters; required by the dispatcher)" role:"dispatcher"`
	// AdminTokenPrevious is set only beside AdminToken, and different.
	AdminTokenPrevious string `env:"ADMIN_TOKEN_PREVIOUS" help:"the admin token being replaced, accepted too during a rotation" role:"dispatcher"`
	// WorkerConcurrency is ≥ 1.
	WorkerConcurrency int `env:"WORKER_CONCURRENCY" envDefault:"50" help:"jobs a worker runs at once" role:"worker"`
	// WebhookConcurrency is ≥ 1.
	WebhookConcurrency int    `env:"WEBHOOK_CONCURRENCY" envDefault:"10" help:"webhook deliveries a worker makes at once, apart from its jobs" role:"worker"`
	LogLevel           string `env:"LOG_LEVEL" envDefault:"info" help:"debug, info, warn or error"`
	LogFormat          string `env:"LOG_FORMAT" envDefault:"json" help:"json or text"`
	// KeyPrefix is 1 to 64 letters, digits, '-', '_' or '.'.
	KeyPrefix string `env:"KEY_PREFIX" envDefault:"llmq" help:"start of every llmq Redis key (to share one Redis)"`
	// ShutdownTimeout bounds a graceful shutdown, > 0.
	ShutdownTimeout     time.Duration `env:"SHUTDOWN_TIMEOUT" envDefault:"30s" help:"grace period of in-flight requests and jobs on SIGTERM"`
	MonitoringReadOnly  bool          `env:"MONITORING_READONLY" envDefault:"true" help:"/monitoring/ refuses everything but GET" role:"dispatcher"`
	WebhookAllowPrivate bool          `env:"WEBHOOK_ALLOW_PRIVATE" envDefault:"false" help:"allow webhooks to loopback, private and link-local addresses"`
	// SyncMaxWait is > 0.
	SyncMaxWait time.Duration `env:"SYNC_MAX_WAIT" envDefault:"60s" help:"longest wait of a synchronous request before its 429" role:"dispatcher"`
	// FaultPause is how long a failing deployment gets no calls, > 0.
	FaultPause time.Duration `env:"FAULT_PAUSE" envDefault:"1s" help:"how long a failing deployment gets no calls before one probe"`
	// MaxBodyBytes, MaxFileBytes and MaxFileLines are each ≥ 1.
	MaxBodyBytes   int64  `env:"MAX_BODY_BYTES" envDefault:"1048576" help:"largest JSON request body" role:"dispatcher"`
	MaxFileBytes   int64  `env:"MAX_FILE_BYTES" envDefault:"209715200" help:"largest batch input file" role:"dispatcher"`
	MaxFileLines   int    `env:"MAX_FILE_LINES" envDefault:"50000" help:"most requests in one batch input file" role:"dispatcher"`
	TrustedProxies string `env:"TRUSTED_PROXIES" help:"reverse proxies (addresses or CIDR ranges, comma-separated) whose X-Forwarded-For names the client"`
	// QueueNamespace starts every asynq queue name: empty, or as KeyPrefix.
	QueueNamespace string `env:"QUEUE_NAMESPACE" help:"prefix of every asynq queue name (to share one Redis)"`

	// Unrecognized lists LLMQ_* variables set but not read, by name only.
	Unrecognized []string
}

// EnvError is an invalid environment variable. Its message never holds a
// secret.
type EnvError struct {
	Var string // the full name, e.g. LLMQ_WORKER_CONCURRENCY
	Msg string // why it is invalid
}

func (e *EnvError) Error() string { return e.Var + ": " + e.Msg }

func envErrorf(field, format string, args ...any) error {
	return &EnvError{Var: EnvPrefix + field, Msg: fmt.Sprintf(format, args...)}
}

// LoadEnv reads the configuration from environ (KEY=value pairs); an empty
// value means the default. It fails only on a value not of its type; call
// Validate next.
func LoadEnv(environ []string) (*Env, error) {
	vars := make(map[string]string, len(environ))
	for _, kv := range environ {
		k, v, _ := strings.Cut(kv, "=")
		vars[k] = v
	}
	if err := readSecretFiles(vars); err != nil {
		return nil, err
	}
	var e Env
	err := env.ParseWithOptions(&e, env.Options{Environment: vars, Prefix: EnvPrefix})
	if err != nil {
		return nil, translateEnvError(err, vars)
	}
	known := make(map[string]bool)
	for _, v := range EnvVars(RoleDev) { // a dev process reads them all
		known[v.Name] = true
	}
	for _, name := range secretEnv {
		known[EnvPrefix+name+FileSuffix] = true
	}
	for k := range vars {
		if strings.HasPrefix(k, EnvPrefix) && !known[k] {
			e.Unrecognized = append(e.Unrecognized, k)
		}
	}
	slices.Sort(e.Unrecognized)
	return &e, nil
}

func envName(f reflect.StructField) string {
	name, _, _ := strings.Cut(f.Tag.Get("env"), ",")
	return name
}

// translateEnvError turns the env library's error into one line naming the
// variable. Only numbers, booleans and durations fail to parse, so the value
// (never a secret) is shown.
func translateEnvError(err error, vars map[string]string) error {
	var pe env.ParseError
	if !errors.As(err, &pe) {
		return fmt.Errorf("environment: %w", err)
	}
	f, ok := reflect.TypeFor[Env]().FieldByName(pe.Name)
	if !ok {
		return fmt.Errorf("environment: %w", err)
	}
	name := envName(f)
	got := vars[EnvPrefix+name]
	if f.Type == reflect.TypeFor[time.Duration]() {
		return envErrorf(name, "must be a duration such as 30s or 2m, got %q", got)
	}
	if f.Type.Kind() == reflect.Bool {
		return envErrorf(name, "must be true or false, got %q", got)
	}
	return envErrorf(name, "must be a whole number, got %q", got)
}

// DefaultListenAddr is LLMQ_LISTEN_ADDR when unset: the worker's differs
// from the dispatcher's, so both run on one host.
func DefaultListenAddr(role Role) string {
	if role == RoleWorker {
		return ":8081"
	}
	return ":8080"
}

// DefaultMetricsAddr is LLMQ_METRICS_ADDR when unset: loopback; none in
// dev mode, which serves /metrics behind the admin token.
func DefaultMetricsAddr(role Role) string {
	return map[Role]string{RoleDispatcher: "127.0.0.1:9464", RoleWorker: "127.0.0.1:9465"}[role]
}

// Validate fills in the role's defaults, checks every variable and returns
// the first problem, naming the variable, never a secret.
func (e *Env) Validate(role Role) error {
	if !slices.Contains([]Role{RoleDispatcher, RoleWorker, RoleDev}, role) {
		return fmt.Errorf("config: unknown role %q (want dispatcher, worker or dev)", role)
	}
	if _, err := redisconn.Parse(e.RedisURL); err != nil {
		return envErrorf("REDIS_URL", "%v", err)
	}
	if err := validateDatabaseURL(e.DatabaseURL); err != nil {
		return err
	}
	e.ListenAddr = cmp.Or(e.ListenAddr, DefaultListenAddr(role))
	if err := validateAddr("LISTEN_ADDR", e.ListenAddr); err != nil {
		return err
	}
	e.MetricsAddr = cmp.Or(e.MetricsAddr, DefaultMetricsAddr(role))
	if e.MetricsAddr != "" {
		if err := validateAddr("METRICS_ADDR", e.MetricsAddr); err != nil {
			return err
		}
		if e.MetricsAddr == e.ListenAddr && !strings.HasSuffix(e.ListenAddr, ":0") {
			return envErrorf("METRICS_ADDR", "must differ from LLMQ_LISTEN_ADDR (%s): /metrics has a listener of its own", e.ListenAddr)
		}
	}
	if strings.TrimSpace(e.Policy) == "" {
		return envErrorf("POLICY", "must be the path of the policy file, got an empty value")
	}
	if err := validateAdminToken(e.AdminToken, role); err != nil {
		return err
	}
	if e.AdminTokenPrevious != "" {
		if e.AdminToken == "" {
			return envErrorf("ADMIN_TOKEN_PREVIOUS", "is set without LLMQ_ADMIN_TOKEN: a rotation needs the new token there")
		}
		if err := validateAdminToken(e.AdminTokenPrevious, role); err != nil {
			return envErrorf("ADMIN_TOKEN_PREVIOUS", "%s", err.(*EnvError).Msg)
		}
		if e.AdminTokenPrevious == e.AdminToken {
			return envErrorf("ADMIN_TOKEN_PREVIOUS", "is the same as LLMQ_ADMIN_TOKEN: it should be the token being replaced")
		}
	}
	_, proxiesErr := e.TrustedProxyPrefixes()
	return cmp.Or( // the first problem, in this order
		aboveZero("WORKER_CONCURRENCY", e.WorkerConcurrency, "at least 1"),
		aboveZero("WEBHOOK_CONCURRENCY", e.WebhookConcurrency, "at least 1"),
		oneOfFolded("LOG_LEVEL", e.LogLevel, "debug, info, warn or error", "debug", "info", "warn", "error"),
		oneOfFolded("LOG_FORMAT", e.LogFormat, "json or text", "json", "text"),
		validateName("KEY_PREFIX", e.KeyPrefix, false),
		aboveZero("SHUTDOWN_TIMEOUT", e.ShutdownTimeout, "more than 0"),
		aboveZero("FAULT_PAUSE", e.FaultPause, "more than 0"),
		aboveZero("SYNC_MAX_WAIT", e.SyncMaxWait, "more than 0"),
		aboveZero("MAX_BODY_BYTES", e.MaxBodyBytes, "at least 1"),
		aboveZero("MAX_FILE_BYTES", e.MaxFileBytes, "at least 1"),
		aboveZero("MAX_FILE_LINES", e.MaxFileLines, "at least 1"),
		proxiesErr,
		validateName("QUEUE_NAMESPACE", e.QueueNamespace, true),
	)
}

// aboveZero refuses a value of field that is 0 or less; must says what it
// must be.
func aboveZero[T int | int64 | time.Duration](field string, v T, must string) error {
	if v > 0 {
		return nil
	}
	return envErrorf(field, "must be %s, got %v", must, v)
}

// oneOfFolded refuses a value of field that is none of values (want), in
// any case.
func oneOfFolded(field, v, want string, values ...string) error {
	if slices.Contains(values, strings.ToLower(v)) {
		return nil
	}
	return envErrorf(field, "must be %s, got %q", want, v)
}

// TrustedProxyPrefixes parses TrustedProxies: each entry an address (a
// one-address prefix) or a CIDR range, masked to its network.
func (e *Env) TrustedProxyPrefixes() ([]netip.Prefix, error) {
	var out []netip.Prefix
	for i, f := range strings.FieldsFunc(e.TrustedProxies, func(r rune) bool { return r == ',' || r == ' ' || r == '\t' }) {
		if strings.Contains(f, "/") {
			p, err := netip.ParsePrefix(f)
			if err != nil {
				return nil, envErrorf("TRUSTED_PROXIES", "entry %d, %q, is not a CIDR range such as 10.0.0.0/8 or fd00::/8", i+1, f)
			}
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(f)
		if err != nil || a.Zone() != "" {
			return nil, envErrorf("TRUSTED_PROXIES", "entry %d, %q, is not an IP address or CIDR range (such as 192.168.1.10 or 10.0.0.0/8)", i+1, f)
		}
		out = append(out, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
	}
	return out, nil
}

// DatabaseDialect is the store DatabaseURL selects: "postgres" or "sqlite".
func (e *Env) DatabaseDialect() string {
	scheme, _, _ := strings.Cut(e.DatabaseURL, ":")
	switch strings.ToLower(scheme) {
	case "sqlite", "file":
		return "sqlite"
	}
	return "postgres"
}

var logLevels = map[string]slog.Level{
	"debug": slog.LevelDebug,
	"info":  slog.LevelInfo,
	"warn":  slog.LevelWarn,
	"error": slog.LevelError,
}

// Logger builds the process logger writing to w, at LogLevel in LogFormat
// (else info and json).
func (e *Env) Logger(w io.Writer) *slog.Logger {
	// An unknown level is the zero Level, info.
	opts := &slog.HandlerOptions{Level: logLevels[strings.ToLower(e.LogLevel)]}
	if strings.EqualFold(e.LogFormat, "text") {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}

func validateDatabaseURL(raw string) error {
	if strings.HasPrefix(raw, "file:") {
		if len(raw) == len("file:") {
			return envErrorf("DATABASE_URL", "file: must be followed by the path of the SQLite database")
		}
		return nil
	}
	if raw == "" {
		return envErrorf("DATABASE_URL", "must be set, got an empty value")
	}
	u, err := url.Parse(raw)
	if ue := (*url.Error)(nil); errors.As(err, &ue) {
		err = ue.Err // url.Parse's error quotes the password
	}
	if err != nil {
		return envErrorf("DATABASE_URL", "not a valid URL: %v", err)
	}
	switch u.Scheme {
	case "postgres", "postgresql":
		return nil
	case "sqlite":
		if u.Host == "" && u.Path == "" && u.Opaque == "" {
			return envErrorf("DATABASE_URL", "sqlite:// must be followed by the path of the database")
		}
		return nil
	}
	return envErrorf("DATABASE_URL", "scheme must be postgres, postgresql, sqlite or file, got %q", u.Scheme)
}

func validateAddr(field, addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return envErrorf(field, "must be host:port or :port, got %q", addr)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return envErrorf(field, "port must be a number from 0 to 65535, got %q", port)
	}
	return nil
}

func validateAdminToken(token string, role Role) error {
	if token == "" && role != RoleDispatcher {
		return nil
	}
	if token == "" {
		return envErrorf("ADMIN_TOKEN", "is not set: the dispatcher needs an admin token of at least %d characters "+
			"(for example from `openssl rand -hex 24`); `dispatcher dev` runs llmq without one", minAdminTokenLen)
	}
	if n := len(token); n < minAdminTokenLen {
		return envErrorf("ADMIN_TOKEN", "must be at least %d characters, got %d", minAdminTokenLen, n)
	}
	if strings.ContainsFunc(token, isSpaceOrControl) {
		return envErrorf("ADMIN_TOKEN", "must not contain spaces or control characters")
	}
	return nil
}

// validateName checks a part of Redis keys or queue names: braces would
// change the Cluster slot, spaces and colons make keys ambiguous.
func validateName(field, s string, mayBeEmpty bool) error {
	if s == "" {
		if mayBeEmpty {
			return nil
		}
		return envErrorf(field, "must be set, got an empty value")
	}
	if len(s) > 64 {
		return envErrorf(field, "must be at most 64 characters, got %d", len(s))
	}
	if !keyName.MatchString(s) {
		return envErrorf(field, "may hold only letters, digits, '-', '_' and '.', got %q", s)
	}
	return nil
}

var keyName = regexp.MustCompile(`^[A-Za-z0-9._-]*$`)

func isSpaceOrControl(r rune) bool { return r <= ' ' || r == 0x7f }
