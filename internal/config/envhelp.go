package config

import (
	"reflect"
	"strings"
)

// EnvVar is one LLMQ_* variable as help shows it.
type EnvVar struct {
	Name    string // e.g. LLMQ_REDIS_URL
	Default string // for the role; empty when none
	Help    string
}

// EnvVars lists the variables a process of role reads, from Env's tags, with
// the role's defaults.
func EnvVars(role Role) []EnvVar {
	var out []EnvVar
	t := reflect.TypeFor[Env]()
	for i := range t.NumField() {
		f := t.Field(i)
		name := envName(f)
		if name == "" {
			continue
		}
		if only := f.Tag.Get("role"); only != "" && role != RoleDev && Role(only) != role {
			continue
		}
		def := f.Tag.Get("envDefault")
		switch name {
		case "LISTEN_ADDR":
			def = DefaultListenAddr(role)
		case "METRICS_ADDR":
			def = DefaultMetricsAddr(role)
		}
		out = append(out, EnvVar{Name: EnvPrefix + name, Default: def, Help: f.Tag.Get("help")})
	}
	return out
}

// EnvHelp is the "Environment" part of a command's help.
func EnvHelp(role Role) string {
	var b strings.Builder
	b.WriteString("Environment (an empty value means the default):\n")
	for _, v := range EnvVars(role) {
		b.WriteString("  " + v.Name)
		if v.Default != "" {
			b.WriteString(" (default " + v.Default + ")")
		}
		b.WriteString("\n      " + v.Help + "\n")
	}
	b.WriteString("A secret (LLMQ_DATABASE_URL, LLMQ_REDIS_URL, a provider's key")
	if role != RoleWorker {
		b.WriteString(", the admin tokens")
	}
	b.WriteString(") may instead be read from the file\nthat its name with _FILE names, e.g. LLMQ_DATABASE_URL_FILE.")
	return b.String()
}
