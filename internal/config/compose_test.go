package config

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/goccy/go-yaml"
)

// repoRoot is where docker-compose.yml resolves its relative paths.
const repoRoot = "../.."

type composeFile struct {
	Services map[string]composeService `yaml:"services"`
}

type composeService struct {
	Image       string            `yaml:"image"`
	Build       any               `yaml:"build"`
	PullPolicy  string            `yaml:"pull_policy"`
	Entrypoint  []string          `yaml:"entrypoint"`
	Command     []string          `yaml:"command"`
	Environment map[string]string `yaml:"environment"`
	Volumes     []string          `yaml:"volumes"`
	Restart     string            `yaml:"restart"`
	Ports       []string          `yaml:"ports"`
	Healthcheck *struct {
		Test []string `yaml:"test"`
	} `yaml:"healthcheck"`
	DependsOn any `yaml:"depends_on"`
}

// binary is the llmq program a service of the llmq image runs.
func (s composeService) binary() string {
	if len(s.Entrypoint) == 0 {
		return "dispatcher" // the image's ENTRYPOINT
	}
	return filepath.Base(s.Entrypoint[0])
}

// flag returns the value after name in the service's command.
func (s composeService) flag(name string) string {
	if i := slices.Index(s.Command, name); i >= 0 && i+1 < len(s.Command) {
		return s.Command[i+1]
	}
	return ""
}

// composeVar matches what Compose interpolates: $$, ${NAME[:-?]...} and $NAME.
var composeVar = regexp.MustCompile(`\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)`)

// interpolate substitutes variables as Compose does, from vars (the shell
// of whoever runs `docker compose up`); a required variable that is unset
// is an error, as Compose refuses to start.
func interpolate(s string, vars map[string]string) (string, error) {
	var err error
	out := composeVar.ReplaceAllStringFunc(s, func(m string) string {
		if m == "$$" {
			return "$"
		}
		g := composeVar.FindStringSubmatch(m)
		name, op, arg := g[1], g[2], g[3]
		if name == "" {
			name = g[4]
		}
		v, set := vars[name]
		switch {
		case op == ":-" && v == "", op == "-" && !set:
			return arg
		case op == ":?" && v == "", op == "?" && !set:
			err = fmt.Errorf("compose refuses to start: %s is required (%s)", name, arg)
		}
		return v
	})
	return out, err
}

// TestComposeFileRunsAsShipped reads docker-compose.yml as Compose would,
// with only LLMQ_ADMIN_TOKEN and GRAFANA_ADMIN_PASSWORD set (the .env the
// README's commands write), and checks
// what must hold for `docker compose up` to give a working llmq: every
// LLMQ_* variable exists and validates, the mounted policy passes
// validation with its provider's key set, that provider is the sim service,
// the image is built once, Redis keeps an AOF, two workers run, and each
// dependency on a healthy service has a healthcheck.
func TestComposeFileRunsAsShipped(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile(filepath.Join(repoRoot, "docker-compose.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var cf composeFile
	if err := yaml.Unmarshal(raw, &cf); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	shell := map[string]string{"LLMQ_ADMIN_TOKEN": "0123456789abcdef0123456789abcdef", "GRAFANA_ADMIN_PASSWORD": "not-admin"}
	for name, s := range cf.Services {
		for k, v := range s.Environment {
			if s.Environment[k], err = interpolate(v, shell); err != nil {
				t.Errorf("service %s: %s: %v", name, k, err)
			}
		}
		for i, v := range s.Volumes {
			if s.Volumes[i], err = interpolate(v, shell); err != nil {
				t.Errorf("service %s: volume %q: %v", name, v, err)
			}
		}
		for i, v := range s.Command {
			if s.Command[i], err = interpolate(v, shell); err != nil {
				t.Errorf("service %s: command %q: %v", name, v, err)
			}
		}
	}
	dockerfile, err := os.ReadFile(filepath.Join(repoRoot, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}

	// One image, built once, run by every llmq service.
	var image, builder string
	for name, s := range cf.Services {
		if s.Build != nil {
			if builder != "" {
				t.Errorf("services %s and %s both build the image: build it once and share its image tag", builder, name)
			}
			builder, image = name, s.Image
		}
	}
	if builder == "" || image == "" {
		t.Fatalf("no service builds the llmq image under an image: tag (builder %q, image %q)", builder, image)
	}
	llmqServices := map[string]composeService{}
	for name, s := range cf.Services {
		if s.Image != image {
			continue
		}
		llmqServices[name] = s
		if name != builder && s.PullPolicy != "never" {
			t.Errorf("service %s: pull_policy %q; want never, its image is built by %s", name, s.PullPolicy, builder)
		}
		if !strings.Contains(string(dockerfile), "./cmd/"+s.binary()) {
			t.Errorf("service %s runs %s, which the Dockerfile does not build", name, s.binary())
		}
	}

	// The simulator.
	var simName string
	var sim composeService
	for name, s := range llmqServices {
		if s.binary() == "llmq-sim" {
			simName, sim = name, s
		}
	}
	if simName == "" {
		t.Fatal("no service runs llmq-sim")
	}
	_, simPort, err := net.SplitHostPort(sim.flag("-addr"))
	if err != nil {
		t.Fatalf("service %s: -addr %q: %v", simName, sim.flag("-addr"), err)
	}
	simKey := sim.flag("-api-key")

	workers, migrations := 0, ""
	for name, s := range llmqServices {
		var role Role
		switch s.binary() {
		case "worker":
			role = RoleWorker
			workers++
		case "dispatcher":
			role = RoleDispatcher
			if slices.Equal(s.Command, []string{"migrate", "up"}) {
				migrations = name
				continue
			}
			if !slices.Equal(s.Command, []string{"serve"}) {
				t.Errorf("service %s: command %q, want [serve]", name, s.Command)
			}
		default:
			continue
		}
		t.Run(name, func(t *testing.T) {
			var environ []string
			for k, v := range s.Environment {
				environ = append(environ, k+"="+v)
			}
			env, err := LoadEnv(environ)
			if err != nil {
				t.Fatal(err)
			}
			if len(env.Unrecognized) > 0 {
				t.Errorf("sets %v, which llmq does not read", env.Unrecognized)
			}
			if err := env.Validate(role); err != nil {
				t.Errorf("the %s refuses its environment: %v", role, err)
			}
			if s.Environment["LLMQ_LISTEN_ADDR"] == "" {
				t.Error("LLMQ_LISTEN_ADDR is not set: the healthcheck probes the address it names")
			}
			// Prometheus runs in a container of its own: loopback, the
			// default, is out of its reach.
			if host, _, err := net.SplitHostPort(env.MetricsAddr); err != nil || host != "" && host != "0.0.0.0" {
				t.Errorf("LLMQ_METRICS_ADDR %q: Prometheus cannot reach it from its container; want :PORT", env.MetricsAddr)
			}
			if s.Healthcheck == nil || !slices.Equal(s.Healthcheck.Test, []string{"CMD", "/usr/local/bin/dispatcher", "healthcheck"}) {
				t.Errorf("healthcheck %+v, want the dispatcher's healthcheck command", s.Healthcheck)
			}

			// The policy file: in a directory mounted where LLMQ_POLICY
			// says (a file mounted alone would never see an editor's
			// replacement), valid, and with every provider key it names set.
			var host string
			for _, v := range s.Volumes {
				src, dst, _ := strings.Cut(v, ":")
				dst, _, _ = strings.Cut(dst, ":")
				if dst == env.Policy {
					t.Errorf("the policy file is mounted alone (%s): mount its directory, so a replaced file is seen", v)
				}
				if rest, ok := strings.CutPrefix(env.Policy, dst+"/"); ok {
					host = filepath.Join(src, rest)
				}
			}
			if host == "" {
				t.Fatalf("no directory holding LLMQ_POLICY %s is mounted (volumes %v)", env.Policy, s.Volumes)
			}
			p, err := loadPolicy(filepath.Join(repoRoot, host))
			if err != nil {
				t.Fatalf("policy %s: %v", host, err)
			}
			lookup := func(k string) (string, bool) { v, ok := s.Environment[k]; return v, ok }
			if err := p.CheckAPIKeys(lookup); err != nil {
				t.Errorf("policy %s: the worker would refuse to start: %v", host, err)
			}
			for i, pr := range p.Providers {
				u, err := url.Parse(pr.BaseURL)
				if err != nil {
					t.Fatal(err)
				}
				if u.Hostname() != simName || u.Port() != simPort || u.Path != "/v1" {
					t.Errorf("policy %s: providers[%d].base_url %s, want http://%s:%s/v1 (the %s service)", host, i, pr.BaseURL, simName, simPort, simName)
				}
				if simKey == "" || s.Environment[pr.APIKeyEnv] != simKey {
					t.Errorf("policy %s: providers[%d] sends %s=%q, the %s service wants -api-key %q", host, i, pr.APIKeyEnv, s.Environment[pr.APIKeyEnv], simName, simKey)
				}
			}
			// The documented switch to OpenAI: the example policy, whose
			// key variables the service passes on from the shell.
			example, err := loadPolicy(filepath.Join(repoRoot, "llmq.example.yaml"))
			if err != nil {
				t.Fatal(err)
			}
			for i, pr := range example.Providers {
				if _, ok := s.Environment[pr.APIKeyEnv]; !ok {
					t.Errorf("llmq.example.yaml: providers[%d].api_key_env %s is not passed to the service", i, pr.APIKeyEnv)
				}
			}
		})
	}
	if workers != 2 {
		t.Errorf("%d worker services, want 2", workers)
	}
	// The schema is migrated once, before anything that opens it: serve
	// and the workers refuse a schema not their own.
	if migrations == "" {
		t.Fatal("no service runs `dispatcher migrate up`")
	}
	for name, s := range llmqServices {
		if b := s.binary(); b != "worker" && !(b == "dispatcher" && slices.Equal(s.Command, []string{"serve"})) {
			continue
		}
		deps, _ := s.DependsOn.(map[string]any)
		if c, _ := deps[migrations].(map[string]any); c["condition"] != "service_completed_successfully" {
			t.Errorf("service %s does not wait for %s to complete", name, migrations)
		}
	}
	// What shows every tenant's spend stays on loopback.
	for _, name := range []string{"prometheus", "grafana", "alertmanager"} {
		for _, p := range cf.Services[name].Ports {
			if !strings.HasPrefix(p, "127.0.0.1:") {
				t.Errorf("service %s publishes %q on every interface, want 127.0.0.1:…", name, p)
			}
		}
	}

	redis, ok := cf.Services["redis"]
	if !ok {
		t.Fatal("no redis service")
	}
	if i := slices.Index(redis.Command, "--appendonly"); i < 0 || i+1 >= len(redis.Command) || redis.Command[i+1] != "yes" {
		t.Errorf("redis command %q: want --appendonly yes, so queues survive a restart", redis.Command)
	}
	if _, ok := cf.Services["postgres"]; !ok {
		t.Error("no postgres service")
	}

	for name, s := range cf.Services {
		if s.Restart != "unless-stopped" && name != migrations {
			t.Errorf("service %s: restart %q, want unless-stopped", name, s.Restart)
		}
		deps, _ := s.DependsOn.(map[string]any)
		for dep, cond := range deps {
			c, _ := cond.(map[string]any)
			if c["condition"] == "service_healthy" && cf.Services[dep].Healthcheck == nil {
				t.Errorf("service %s waits for %s to be healthy, which has no healthcheck", name, dep)
			}
			if _, ok := cf.Services[dep]; !ok {
				t.Errorf("service %s depends on %s, not a service", name, dep)
			}
		}
	}
}

func TestComposeInterpolation(t *testing.T) {
	t.Parallel()
	vars := map[string]string{"SET": "v", "EMPTY": ""}
	for in, want := range map[string]string{
		"${SET}":           "v",
		"$SET/x":           "v/x",
		"${UNSET:-d}":      "d",
		"${EMPTY:-d}":      "d",
		"${EMPTY-d}":       "",
		"${UNSET-d}":       "d",
		"${SET:?required}": "v",
		"a$$b":             "a$b",
		"${UNSET}":         "",
	} {
		if got, err := interpolate(in, vars); err != nil || got != want {
			t.Errorf("interpolate(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"${UNSET:?set it}", "${EMPTY:?set it}", "${UNSET?set it}"} {
		if _, err := interpolate(in, vars); err == nil {
			t.Errorf("interpolate(%q): no error", in)
		}
	}
}
