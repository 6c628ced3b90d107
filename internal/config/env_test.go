package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

const goodToken = "0123456789abcdef-admin"

func loadEnv(t *testing.T, kv ...string) *Env {
	t.Helper()
	e, err := LoadEnv(kv)
	if err != nil {
		t.Fatalf("LoadEnv: %v", err)
	}
	return e
}

func TestLoadEnvDefaults(t *testing.T) {
	t.Parallel()
	// LoadEnv reads only what it is given, never the process environment.
	e := loadEnv(t)
	want := Env{
		RedisURL:           "redis://127.0.0.1:6379/0",
		DatabaseURL:        "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable",
		Policy:             "llmq.yaml",
		WorkerConcurrency:  50,
		WebhookConcurrency: 10,
		LogLevel:           "info",
		LogFormat:          "json",
		KeyPrefix:          "llmq",
		ShutdownTimeout:    30 * time.Second,
		MonitoringReadOnly: true,
		SyncMaxWait:        time.Minute,
		FaultPause:         time.Second,
		MaxBodyBytes:       1 << 20,
		MaxFileBytes:       200 << 20,
		MaxFileLines:       50000,
	}
	if got := *e; !envEqual(got, want) {
		t.Errorf("defaults:\n got %+v\nwant %+v", got, want)
	}
	// The addresses depend on the role: a dispatcher and a worker started
	// on one host without configuration do not collide.
	for _, c := range []struct {
		role            Role
		listen, metrics string
	}{{RoleWorker, ":8081", "127.0.0.1:9465"}, {RoleDev, ":8080", ""}} {
		e := loadEnv(t)
		if err := e.Validate(c.role); err != nil {
			t.Errorf("defaults are not valid for %s: %v", c.role, err)
		}
		if e.ListenAddr != c.listen || e.MetricsAddr != c.metrics {
			t.Errorf("%s: LLMQ_LISTEN_ADDR %q, LLMQ_METRICS_ADDR %q; want %q, %q", c.role, e.ListenAddr, e.MetricsAddr, c.listen, c.metrics)
		}
	}
	e = loadEnv(t, "LLMQ_ADMIN_TOKEN="+goodToken)
	if err := e.Validate(RoleDispatcher); err != nil || e.ListenAddr != ":8080" || e.MetricsAddr != "127.0.0.1:9464" {
		t.Errorf("dispatcher: %v, LLMQ_LISTEN_ADDR %q, LLMQ_METRICS_ADDR %q; want :8080, 127.0.0.1:9464", err, e.ListenAddr, e.MetricsAddr)
	}
	// The dispatcher alone cannot run without an admin token.
	if err := loadEnv(t).Validate(RoleDispatcher); err == nil || !strings.HasPrefix(err.Error(), "LLMQ_ADMIN_TOKEN: ") {
		t.Errorf("dispatcher without token: error = %v", err)
	}
	if e.DatabaseDialect() != "postgres" {
		t.Errorf("DatabaseDialect = %q", e.DatabaseDialect())
	}
}

func envEqual(a, b Env) bool {
	a.Unrecognized, b.Unrecognized = nil, nil
	return reflect.DeepEqual(a, b)
}

func TestLoadEnvValues(t *testing.T) {
	t.Parallel()
	e := loadEnv(t,
		"LLMQ_REDIS_URL=rediss://:pw@redis.internal:6380/3",
		"LLMQ_DATABASE_URL=sqlite:///var/lib/llmq/llmq.db",
		"LLMQ_LISTEN_ADDR=127.0.0.1:9090",
		"LLMQ_METRICS_ADDR=10.0.0.2:9464",
		"LLMQ_POLICY=/etc/llmq/policy.yaml",
		"LLMQ_ADMIN_TOKEN="+goodToken,
		"LLMQ_WORKER_CONCURRENCY=8",
		"LLMQ_WEBHOOK_CONCURRENCY=3",
		"LLMQ_LOG_LEVEL=debug",
		"LLMQ_LOG_FORMAT=text",
		"LLMQ_KEY_PREFIX=llmq-staging",
		"LLMQ_SHUTDOWN_TIMEOUT=2m",
		"LLMQ_SYNC_MAX_WAIT=15s",
		"LLMQ_FAULT_PAUSE=3s",
		"LLMQ_MONITORING_READONLY=false",
		"LLMQ_WEBHOOK_ALLOW_PRIVATE=true",
		"LLMQ_MAX_BODY_BYTES=4096",
		"LLMQ_MAX_FILE_BYTES=1048576",
		"LLMQ_MAX_FILE_LINES=10",
		"LLMQ_QUEUE_NAMESPACE=test_42",
		"LLMQ_WORKER_CONCURENCY=9", // a typo
		"LLMQ_EMPTY=",
		"OPENAI_API_KEY=sk-not-ours",
		"PATH=/usr/bin",
	)
	want := Env{
		RedisURL:            "rediss://:pw@redis.internal:6380/3",
		DatabaseURL:         "sqlite:///var/lib/llmq/llmq.db",
		ListenAddr:          "127.0.0.1:9090",
		MetricsAddr:         "10.0.0.2:9464",
		Policy:              "/etc/llmq/policy.yaml",
		AdminToken:          goodToken,
		WorkerConcurrency:   8,
		WebhookConcurrency:  3,
		LogLevel:            "debug",
		LogFormat:           "text",
		KeyPrefix:           "llmq-staging",
		ShutdownTimeout:     2 * time.Minute,
		SyncMaxWait:         15 * time.Second,
		FaultPause:          3 * time.Second,
		MonitoringReadOnly:  false,
		WebhookAllowPrivate: true,
		MaxBodyBytes:        4096,
		MaxFileBytes:        1 << 20,
		MaxFileLines:        10,
		QueueNamespace:      "test_42",
	}
	if !envEqual(*e, want) {
		t.Errorf("\n got %+v\nwant %+v", *e, want)
	}
	if got := strings.Join(e.Unrecognized, ","); got != "LLMQ_EMPTY,LLMQ_WORKER_CONCURENCY" {
		t.Errorf("Unrecognized = %q", got)
	}
	for _, r := range []Role{RoleDispatcher, RoleWorker, RoleDev} {
		if err := e.Validate(r); err != nil {
			t.Errorf("Validate(%s): %v", r, err)
		}
	}
	if e.DatabaseDialect() != "sqlite" {
		t.Errorf("DatabaseDialect = %q, want sqlite", e.DatabaseDialect())
	}
}

func TestLoadEnvEmptyMeansDefault(t *testing.T) {
	t.Parallel()
	e := loadEnv(t, "LLMQ_WORKER_CONCURRENCY=", "LLMQ_REDIS_URL=", "LLMQ_MONITORING_READONLY=")
	if e.WorkerConcurrency != 50 || e.RedisURL != "redis://127.0.0.1:6379/0" || !e.MonitoringReadOnly {
		t.Errorf("empty values did not take the defaults: %+v", e)
	}
}

func TestLoadEnvParseErrors(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ kv, want string }{
		{"LLMQ_WORKER_CONCURRENCY=lots", `LLMQ_WORKER_CONCURRENCY: must be a whole number, got "lots"`},
		{"LLMQ_MAX_BODY_BYTES=1MiB", `LLMQ_MAX_BODY_BYTES: must be a whole number, got "1MiB"`},
		{"LLMQ_MAX_FILE_LINES=1.5", `LLMQ_MAX_FILE_LINES: must be a whole number, got "1.5"`},
		{"LLMQ_SHUTDOWN_TIMEOUT=30", `LLMQ_SHUTDOWN_TIMEOUT: must be a duration such as 30s or 2m, got "30"`},
		{"LLMQ_MONITORING_READONLY=yes", `LLMQ_MONITORING_READONLY: must be true or false, got "yes"`},
		{"LLMQ_WEBHOOK_ALLOW_PRIVATE=on", `LLMQ_WEBHOOK_ALLOW_PRIVATE: must be true or false, got "on"`},
	} {
		_, err := LoadEnv([]string{c.kv})
		if err == nil || err.Error() != c.want {
			t.Errorf("%s: error = %v, want %s", c.kv, err, c.want)
		}
		var ee *EnvError
		if !errors.As(err, &ee) {
			t.Errorf("%s: error %T is not an *EnvError", c.kv, err)
		}
	}
}

// TestValidate holds one case per rule: the variable the error must name,
// part of the reason, and secrets that must not appear in it.
func TestValidate(t *testing.T) {
	t.Parallel()
	const secret = "hunter2hunter2"
	cases := []struct {
		name   string
		role   Role
		kv     []string
		varErr string // "" = valid
		msg    string
	}{
		{"dispatcher with token", RoleDispatcher, []string{"LLMQ_ADMIN_TOKEN=" + goodToken}, "", ""},
		{"dispatcher without token", RoleDispatcher, nil, "LLMQ_ADMIN_TOKEN", "is not set"},
		{"dispatcher empty token", RoleDispatcher, []string{"LLMQ_ADMIN_TOKEN="}, "LLMQ_ADMIN_TOKEN", "`dispatcher dev` runs llmq without one"},
		{"dispatcher short token", RoleDispatcher, []string{"LLMQ_ADMIN_TOKEN=" + secret[:8]}, "LLMQ_ADMIN_TOKEN", "got 8"},
		{"token with space", RoleDispatcher, []string{"LLMQ_ADMIN_TOKEN=" + secret + " " + secret}, "LLMQ_ADMIN_TOKEN", "must not contain spaces"},
		{"dev short token", RoleDev, []string{"LLMQ_ADMIN_TOKEN=" + secret[:8]}, "LLMQ_ADMIN_TOKEN", "at least 16"},
		{"worker short token", RoleWorker, []string{"LLMQ_ADMIN_TOKEN=" + secret[:8]}, "LLMQ_ADMIN_TOKEN", "at least 16"},
		{"unknown role", Role("scheduler"), nil, "", `unknown role "scheduler"`},
		{"previous token", RoleDispatcher, []string{"LLMQ_ADMIN_TOKEN=" + goodToken, "LLMQ_ADMIN_TOKEN_PREVIOUS=" + secret + secret}, "", ""},
		{"previous token short", RoleDispatcher, []string{"LLMQ_ADMIN_TOKEN=" + goodToken, "LLMQ_ADMIN_TOKEN_PREVIOUS=" + secret[:8]}, "LLMQ_ADMIN_TOKEN_PREVIOUS", "at least 16"},
		{"previous token same", RoleDispatcher, []string{"LLMQ_ADMIN_TOKEN=" + goodToken, "LLMQ_ADMIN_TOKEN_PREVIOUS=" + goodToken}, "LLMQ_ADMIN_TOKEN_PREVIOUS", "same as LLMQ_ADMIN_TOKEN"},
		{"previous token alone", RoleDev, []string{"LLMQ_ADMIN_TOKEN_PREVIOUS=" + goodToken}, "LLMQ_ADMIN_TOKEN_PREVIOUS", "without LLMQ_ADMIN_TOKEN"},

		{"redis wrong scheme", RoleWorker, []string{"LLMQ_REDIS_URL=http://u:" + secret + "@h:6379"}, "LLMQ_REDIS_URL", `scheme must be redis, rediss, redis+sentinel or redis+cluster, got "http"`},
		{"redis unparsable", RoleWorker, []string{"LLMQ_REDIS_URL=redis://:" + secret + "@h:port/0"}, "LLMQ_REDIS_URL", "not a valid URL"},
		{"redis no host", RoleWorker, []string{"LLMQ_REDIS_URL=redis:///0"}, "LLMQ_REDIS_URL", "must name a host"},
		{"redis bad db", RoleWorker, []string{"LLMQ_REDIS_URL=redis://:" + secret + "@h:6379/zero"}, "LLMQ_REDIS_URL", "invalid database number"},
		{"redis host only", RoleWorker, []string{"LLMQ_REDIS_URL=redis"}, "LLMQ_REDIS_URL", "not a URL"},
		{"sentinel no master", RoleWorker, []string{"LLMQ_REDIS_URL=redis+sentinel://:" + secret + "@h:26379,h:26380"}, "LLMQ_REDIS_URL", "must name the master"},
		{"sentinel bad db", RoleWorker, []string{"LLMQ_REDIS_URL=redis+sentinel://h:26379/mymaster/x"}, "LLMQ_REDIS_URL", `database number "x"`},
		{"sentinel ok", RoleWorker, []string{"LLMQ_REDIS_URL=redis+sentinel://:" + secret + "@h1:26379,h2:26379/mymaster/2?sentinel_password=" + secret}, "", ""},
		{"cluster db", RoleWorker, []string{"LLMQ_REDIS_URL=redis+cluster://h1:7000,h2:7000/3"}, "LLMQ_REDIS_URL", "only database 0"},
		{"cluster bad port", RoleWorker, []string{"LLMQ_REDIS_URL=redis+cluster://h1:7000,h2:x"}, "LLMQ_REDIS_URL", `"h2:x" has no valid port`},
		{"cluster bad option", RoleWorker, []string{"LLMQ_REDIS_URL=redis+cluster://h1:7000?pool_size=many"}, "LLMQ_REDIS_URL", "pool_size"},
		{"cluster ok", RoleWorker, []string{"LLMQ_REDIS_URL=redis+cluster://u:" + secret + "@h1:7000,h2:7000,h3:7000?read_timeout=2s"}, "", ""},
		{"rediss ok", RoleWorker, []string{"LLMQ_REDIS_URL=rediss://default:" + secret + "@cache.example.com:6380/2"}, "", ""},

		{"database wrong scheme", RoleWorker, []string{"LLMQ_DATABASE_URL=mysql://u:" + secret + "@h/db"}, "LLMQ_DATABASE_URL", `got "mysql"`},
		{"database unparsable", RoleWorker, []string{"LLMQ_DATABASE_URL=postgres://u:" + secret + "@h:port/db"}, "LLMQ_DATABASE_URL", "not a valid URL"},
		{"postgresql ok", RoleWorker, []string{"LLMQ_DATABASE_URL=postgresql://u:" + secret + "@db.example.com/llmq"}, "", ""},
		{"postgres socket ok", RoleWorker, []string{"LLMQ_DATABASE_URL=postgres:///llmq?host=/var/run/postgresql"}, "", ""},
		{"sqlite ok", RoleDev, []string{"LLMQ_DATABASE_URL=sqlite://llmq.db"}, "", ""},
		{"sqlite without path", RoleDev, []string{"LLMQ_DATABASE_URL=sqlite://"}, "LLMQ_DATABASE_URL", "path of the database"},
		{"file ok", RoleDev, []string{"LLMQ_DATABASE_URL=file:llmq.db?_pragma=busy_timeout(5000)"}, "", ""},
		{"file without path", RoleDev, []string{"LLMQ_DATABASE_URL=file:"}, "LLMQ_DATABASE_URL", "path of the SQLite database"},

		{"listen addr no port", RoleDev, []string{"LLMQ_LISTEN_ADDR=localhost"}, "LLMQ_LISTEN_ADDR", `must be host:port or :port, got "localhost"`},
		{"listen addr bad port", RoleDev, []string{"LLMQ_LISTEN_ADDR=:99999"}, "LLMQ_LISTEN_ADDR", `got "99999"`},
		{"metrics addr no port", RoleWorker, []string{"LLMQ_METRICS_ADDR=metrics"}, "LLMQ_METRICS_ADDR", `must be host:port or :port, got "metrics"`},
		{"metrics addr is the listen addr", RoleWorker, []string{"LLMQ_METRICS_ADDR=:9100", "LLMQ_LISTEN_ADDR=:9100"}, "LLMQ_METRICS_ADDR", "must differ from LLMQ_LISTEN_ADDR"},
		{"dev metrics addr", RoleDev, []string{"LLMQ_METRICS_ADDR=127.0.0.1:9464"}, "", ""},
		{"policy blank", RoleWorker, []string{"LLMQ_POLICY=  "}, "LLMQ_POLICY", "empty"},

		{"concurrency zero", RoleWorker, []string{"LLMQ_WORKER_CONCURRENCY=0"}, "LLMQ_WORKER_CONCURRENCY", "must be at least 1, got 0"},
		{"concurrency negative", RoleDev, []string{"LLMQ_WORKER_CONCURRENCY=-3"}, "LLMQ_WORKER_CONCURRENCY", "got -3"},
		{"webhook concurrency zero", RoleWorker, []string{"LLMQ_WEBHOOK_CONCURRENCY=0"}, "LLMQ_WEBHOOK_CONCURRENCY", "must be at least 1, got 0"},
		{"log level", RoleWorker, []string{"LLMQ_LOG_LEVEL=verbose"}, "LLMQ_LOG_LEVEL", `must be debug, info, warn or error, got "verbose"`},
		{"log level any case", RoleWorker, []string{"LLMQ_LOG_LEVEL=WARN"}, "", ""},
		{"log format", RoleWorker, []string{"LLMQ_LOG_FORMAT=logfmt"}, "LLMQ_LOG_FORMAT", `must be json or text, got "logfmt"`},
		{"key prefix brace", RoleWorker, []string{"LLMQ_KEY_PREFIX={llmq}"}, "LLMQ_KEY_PREFIX", "may hold only"},
		{"key prefix colon", RoleWorker, []string{"LLMQ_KEY_PREFIX=a:b"}, "LLMQ_KEY_PREFIX", "may hold only"},
		{"key prefix long", RoleWorker, []string{"LLMQ_KEY_PREFIX=" + strings.Repeat("k", 65)}, "LLMQ_KEY_PREFIX", "at most 64"},
		{"shutdown zero", RoleWorker, []string{"LLMQ_SHUTDOWN_TIMEOUT=0s"}, "LLMQ_SHUTDOWN_TIMEOUT", "must be more than 0"},
		{"sync wait zero", RoleDispatcher, []string{"LLMQ_ADMIN_TOKEN=" + goodToken, "LLMQ_SYNC_MAX_WAIT=0s"}, "LLMQ_SYNC_MAX_WAIT", "must be more than 0"},
		{"fault pause zero", RoleWorker, []string{"LLMQ_FAULT_PAUSE=0s"}, "LLMQ_FAULT_PAUSE", "must be more than 0"},
		{"body bytes zero", RoleDispatcher, []string{"LLMQ_ADMIN_TOKEN=" + goodToken, "LLMQ_MAX_BODY_BYTES=0"}, "LLMQ_MAX_BODY_BYTES", "must be at least 1, got 0"},
		{"file bytes negative", RoleDispatcher, []string{"LLMQ_ADMIN_TOKEN=" + goodToken, "LLMQ_MAX_FILE_BYTES=-1"}, "LLMQ_MAX_FILE_BYTES", "got -1"},
		{"file lines zero", RoleDispatcher, []string{"LLMQ_ADMIN_TOKEN=" + goodToken, "LLMQ_MAX_FILE_LINES=0"}, "LLMQ_MAX_FILE_LINES", "got 0"},
		{"namespace space", RoleWorker, []string{"LLMQ_QUEUE_NAMESPACE=a b"}, "LLMQ_QUEUE_NAMESPACE", "may hold only"},
		{"trusted proxies ok", RoleDispatcher, []string{"LLMQ_ADMIN_TOKEN=" + goodToken, "LLMQ_TRUSTED_PROXIES=10.0.0.0/8, 192.168.1.10,fd00::/8,"}, "", ""},
		{"trusted proxy not an address", RoleDispatcher, []string{"LLMQ_ADMIN_TOKEN=" + goodToken, "LLMQ_TRUSTED_PROXIES=10.0.0.1,10.0.0.300"},
			"LLMQ_TRUSTED_PROXIES", `entry 2, "10.0.0.300", is not an IP address or CIDR range`},
		{"trusted proxy bad CIDR", RoleDispatcher, []string{"LLMQ_ADMIN_TOKEN=" + goodToken, "LLMQ_TRUSTED_PROXIES=10.0.0.0/33"},
			"LLMQ_TRUSTED_PROXIES", `entry 1, "10.0.0.0/33", is not a CIDR range`},
		{"trusted proxy host name", RoleDispatcher, []string{"LLMQ_ADMIN_TOKEN=" + goodToken, "LLMQ_TRUSTED_PROXIES=lb.internal"},
			"LLMQ_TRUSTED_PROXIES", `"lb.internal", is not an IP address`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := loadEnv(t, c.kv...)
			err := e.Validate(c.role)
			if c.msg == "" {
				if err != nil {
					t.Fatalf("Validate(%s) = %v, want nil", c.role, err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate(%s) accepted it", c.role)
			}
			msg := err.Error()
			if c.varErr != "" && !strings.HasPrefix(msg, c.varErr+": ") {
				t.Errorf("error %q does not start with %q", msg, c.varErr+": ")
			}
			if !strings.Contains(msg, c.msg) {
				t.Errorf("error %q does not contain %q", msg, c.msg)
			}
			if strings.Contains(msg, secret[:8]) || strings.Contains(msg, "\n") {
				t.Errorf("error %q leaks a secret or spans lines", msg)
			}
		})
	}
}

// Trusted proxies are read as ranges: an address is a range of one, a
// range is masked to its network, an IPv4-mapped address is IPv4.
func TestTrustedProxyPrefixes(t *testing.T) {
	t.Parallel()
	e := loadEnv(t, "LLMQ_TRUSTED_PROXIES=10.1.2.3/8 ::ffff:192.168.1.10, 2001:db8::1")
	ps, err := e.TrustedProxyPrefixes()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range ps {
		got = append(got, p.String())
	}
	if strings.Join(got, " ") != "10.0.0.0/8 192.168.1.10/32 2001:db8::1/128" {
		t.Fatalf("prefixes = %v", got)
	}
	if ps, err := loadEnv(t).TrustedProxyPrefixes(); err != nil || len(ps) != 0 {
		t.Fatalf("unset: %v, %v; want none", ps, err)
	}
}

func TestLogger(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	e := loadEnv(t, "LLMQ_LOG_LEVEL=warn")
	log := e.Logger(&buf)
	log.Info("quiet")
	log.Warn("loud", "n", 1)
	var rec map[string]any
	if err := json.Unmarshal(buf.Bytes(), &rec); err != nil {
		t.Fatalf("want exactly one JSON record, got %q: %v", buf.String(), err)
	}
	if rec["msg"] != "loud" || rec["level"] != "WARN" || rec["n"] != 1.0 {
		t.Errorf("record = %v", rec)
	}

	buf.Reset()
	e = loadEnv(t, "LLMQ_LOG_LEVEL=debug", "LLMQ_LOG_FORMAT=text")
	e.Logger(&buf).Debug("details", "k", "v")
	if got := buf.String(); !strings.Contains(got, "level=DEBUG") || !strings.Contains(got, "msg=details k=v") {
		t.Errorf("text record = %q", got)
	}
}

// Help lists every variable a role reads, with the role's default, and
// none it does not read.
func TestEnvHelp(t *testing.T) {
	t.Parallel()
	t.Run("worker", func(t *testing.T) {
		t.Parallel()
		help := EnvHelp(RoleWorker)
		for _, want := range []string{
			"LLMQ_REDIS_URL (default redis://127.0.0.1:6379/0)",
			"LLMQ_LISTEN_ADDR (default :8081)",
			"LLMQ_METRICS_ADDR (default 127.0.0.1:9465)",
			"LLMQ_POLICY (default llmq.yaml)",
			"LLMQ_WORKER_CONCURRENCY (default 50)",
			"LLMQ_SHUTDOWN_TIMEOUT (default 30s)",
			"LLMQ_QUEUE_NAMESPACE\n",
		} {
			if !strings.Contains(help, want) {
				t.Errorf("worker help lacks %q:\n%s", want, help)
			}
		}
		for _, not := range []string{"LLMQ_ADMIN_TOKEN", "LLMQ_MAX_BODY_BYTES", "LLMQ_MONITORING_READONLY"} {
			if strings.Contains(help, not) {
				t.Errorf("worker help lists %s, which the worker does not read", not)
			}
		}
	})
	t.Run("dispatcher", func(t *testing.T) {
		t.Parallel()
		help := EnvHelp(RoleDispatcher)
		for _, want := range []string{"LLMQ_LISTEN_ADDR (default :8080)", "LLMQ_METRICS_ADDR (default 127.0.0.1:9464)",
			"LLMQ_ADMIN_TOKEN\n", "LLMQ_MAX_FILE_BYTES (default 209715200)"} {
			if !strings.Contains(help, want) {
				t.Errorf("dispatcher help lacks %q:\n%s", want, help)
			}
		}
		if strings.Contains(help, "LLMQ_WORKER_CONCURRENCY") {
			t.Error("dispatcher help lists LLMQ_WORKER_CONCURRENCY")
		}
	})
	// Every variable LoadEnv reads is listed, with a description.
	all := map[string]bool{}
	for _, v := range append(EnvVars(RoleDispatcher), EnvVars(RoleWorker)...) {
		all[v.Name] = true
		if v.Help == "" {
			t.Errorf("%s has no help", v.Name)
		}
	}
	typ := reflect.TypeFor[Env]()
	for i := range typ.NumField() {
		if name := envName(typ.Field(i)); name != "" && !all[EnvPrefix+name] {
			t.Errorf("%s%s is read but no role's help lists it", EnvPrefix, name)
		}
	}
}

// A secret variable may be read from the file its _FILE names (Docker and
// Kubernetes secrets); errors name the variable and the file, never the
// secret.
func TestSecretsFromFiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	token := write("token", goodToken+"\n")
	dbURL := write("db", "postgres://llmq:s3cret-pass@db:5432/llmq\r\n")
	e, err := LoadEnv([]string{"LLMQ_ADMIN_TOKEN_FILE=" + token, "LLMQ_DATABASE_URL_FILE=" + dbURL})
	if err != nil {
		t.Fatal(err)
	}
	if e.AdminToken != goodToken || e.DatabaseURL != "postgres://llmq:s3cret-pass@db:5432/llmq" || len(e.Unrecognized) != 0 {
		t.Fatalf("token %q, database %q, unrecognized %v", e.AdminToken, e.DatabaseURL, e.Unrecognized)
	}
	if err := e.Validate(RoleDispatcher); err != nil {
		t.Fatal(err)
	}

	for _, c := range []struct {
		name string
		kv   []string
		want string
	}{
		{"both", []string{"LLMQ_ADMIN_TOKEN=" + goodToken, "LLMQ_ADMIN_TOKEN_FILE=" + token}, "LLMQ_ADMIN_TOKEN_FILE: LLMQ_ADMIN_TOKEN and LLMQ_ADMIN_TOKEN_FILE are both set: set one"},
		{"missing", []string{"LLMQ_ADMIN_TOKEN_FILE=" + filepath.Join(dir, "nope")}, "LLMQ_ADMIN_TOKEN_FILE: cannot read " + filepath.Join(dir, "nope") + ": no such file or directory"},
		{"empty", []string{"LLMQ_REDIS_URL_FILE=" + write("empty", "\n")}, "LLMQ_REDIS_URL_FILE: " + filepath.Join(dir, "empty") + " is empty"},
	} {
		_, err := LoadEnv(c.kv)
		if err == nil || err.Error() != c.want {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), goodToken) {
			t.Errorf("%s: the error shows the secret: %v", c.name, err)
		}
	}

	// A provider's key, through the lookup the app uses and CheckAPIKeys.
	lookup := func(env map[string]string) func(string) (string, bool) {
		return func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	}
	key := write("openai", "sk-from-a-file\n")
	if v, ok := SecretLookup(lookup(map[string]string{"OPENAI_API_KEY_FILE": key}))("OPENAI_API_KEY"); !ok || v != "sk-from-a-file" {
		t.Errorf("provider key from a file = %q, %v", v, ok)
	}
	p, err := ParsePolicy([]byte(`
providers: [{name: openai, base_url: "https://api.openai.com/v1", api_key_env: OPENAI_API_KEY}]
models: [{name: m, provider: openai, price: {input_per_mtok: 1, output_per_mtok: 1}, limits: {rpm: 10, tpm: 100000}}]
tiers: [{name: t, daily_budget_usd: 1, api_rps: 5}]
`))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.CheckAPIKeys(lookup(map[string]string{"OPENAI_API_KEY_FILE": key})); err != nil {
		t.Errorf("key from a file: %v", err)
	}
	err = p.CheckAPIKeys(lookup(map[string]string{"OPENAI_API_KEY_FILE": filepath.Join(dir, "gone")}))
	if err == nil || !strings.Contains(err.Error(), "OPENAI_API_KEY_FILE: cannot read") {
		t.Errorf("unreadable key file: %v", err)
	}
	if err := p.CheckAPIKeys(lookup(nil)); err == nil || !strings.Contains(err.Error(), "nor OPENAI_API_KEY_FILE") {
		t.Errorf("no key: %v", err)
	}
}

// retention: ages of at least an hour (the ledger's three days), or 0 to
// keep; absent keeps.
func TestPolicyRetention(t *testing.T) {
	t.Parallel()
	const base = `
providers: [{name: openai, base_url: "https://api.openai.com/v1", api_key_env: OPENAI_API_KEY}]
models: [{name: m, provider: openai, price: {input_per_mtok: 1, output_per_mtok: 1}, limits: {rpm: 10, tpm: 100000}}]
tiers: [{name: t, daily_budget_usd: 1, api_rps: 5}]
`
	p, err := ParsePolicy([]byte(base + "retention: {finished_jobs: 720h, files: 168h, ledger: 2160h}\n"))
	if err != nil || p.Retention.FinishedJobs != 720*time.Hour || p.Retention.Files != 168*time.Hour || p.Retention.Ledger != 2160*time.Hour {
		t.Fatalf("retention = %+v, %v", p.Retention, err)
	}
	if p, err := ParsePolicy([]byte(base)); err != nil || p.Retention != (Retention{}) {
		t.Fatalf("no retention = %+v, %v; want keep", p.Retention, err)
	}
	for in, want := range map[string]string{
		"retention: {finished_jobs: 30m}":      "retention.finished_jobs: must be 0 (keep) or at least 1h0m0s, got 30m",
		"retention: {files: a week}":           `retention.files: must be a duration such as 720h (30 days), or 0 to keep for ever, got "a week"`,
		"retention: {finished_jobs: 0s}":       "",
		"retention: {ledger: 24h}":             "retention.ledger: must be 0 (keep) or at least 72h0m0s: a budget audit and a late delivery read recent rows, got 24h",
		"retention: {ledger: 0}":               "",
		"retention: {finished_jobs: 1h, x: 1}": "x",
	} {
		_, err := ParsePolicy([]byte(base + in + "\n"))
		switch {
		case want == "" && err != nil:
			t.Errorf("%s: %v", in, err)
		case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
			t.Errorf("%s: %v, want %q", in, err, want)
		}
	}
}

// Batch offload: a tier's batch_offload, a model's batch prices (default
// half), a provider's batch_api (default for kind openai only), and the
// route batches go to.
func TestPolicyBatchOffload(t *testing.T) {
	t.Parallel()
	const base = `
providers:
  - {name: az, kind: azure, base_url: "https://r.openai.azure.com", api_key_env: AZ_KEY}
  - {name: openai, base_url: "https://api.openai.com/v1", api_key_env: OPENAI_API_KEY}
models:
  - name: m
    price: {input_per_mtok: 2, output_per_mtok: 8, batch_output_per_mtok: 3}
    deployments:
      - {provider: az, upstream: m-ptu, limits: {rpm: 10, tpm: 100000}}
      - {provider: openai, upstream: m-1, order: 1, limits: {rpm: 10, tpm: 100000, batch_queue_tokens: 90000}}
  - {name: e, provider: az, kind: embedding, price: {input_per_mtok: 0.1}, limits: {rpm: 10, tpm: 100000}}
`
	p, err := ParsePolicy([]byte(base + "tiers: [{name: t, daily_budget_usd: 1, api_rps: 5, batch_offload: auto}, {name: u, daily_budget_usd: 1, api_rps: 5}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if tt, _ := p.Tier("t"); tt.BatchOffload != BatchOffloadAuto {
		t.Fatalf("batch_offload = %q", tt.BatchOffload)
	}
	if u, _ := p.Tier("u"); u.BatchOffload != BatchOffloadNever {
		t.Fatalf("default batch_offload = %q, want never", u.BatchOffload)
	}
	r, ok := p.BatchRoute("m")
	if !ok || r.Provider != "openai" || r.Upstream != "m-1" || r.Limits.BatchQueueTokens != 90000 {
		t.Fatalf("BatchRoute(m) = %+v, %v; want the openai deployment", r, ok)
	}
	if b := r.Price.Batch(); b.InputPerMTok != 1_000_000 || b.OutputPerMTok != 3_000_000 {
		t.Fatalf("batch price = %+v, want input half (1) and output as given (3)", b)
	}
	if _, ok := p.BatchRoute("e"); ok {
		t.Fatal("an Azure provider offered a Batch API without batch_api: true")
	}
	withAzureBatch := strings.Replace(base, `api_key_env: AZ_KEY}`, `api_key_env: AZ_KEY, batch_api: true}`, 1)
	p, err = ParsePolicy([]byte(withAzureBatch + "tiers: [{name: t, daily_budget_usd: 1, api_rps: 5}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if r, ok := p.BatchRoute("e"); !ok || r.Provider != "az" {
		t.Fatalf("BatchRoute(e) with batch_api = %+v, %v", r, ok)
	}
	for in, want := range map[string]string{
		"tiers: [{name: t, daily_budget_usd: 1, api_rps: 5, batch_offload: sometimes}]": `tiers[0].batch_offload: must be never, auto or always, got "sometimes"`,
	} {
		if _, err := ParsePolicy([]byte(base + in + "\n")); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", in, err, want)
		}
	}
	if _, err := ParsePolicy([]byte(strings.Replace(base, "batch_queue_tokens: 90000", "batch_queue_tokens: -1", 1) +
		"tiers: [{name: t, daily_budget_usd: 1, api_rps: 5}]\n")); err == nil || !strings.Contains(err.Error(), "batch_queue_tokens: must be 0 or more") {
		t.Errorf("a negative batch_queue_tokens: %v", err)
	}
}
