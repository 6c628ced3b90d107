package config

import (
	"fmt"
	"os"
	"strings"
)

// FileSuffix ends the name of a variable that holds the path of a file
// whose content is the secret of the variable without it: LLMQ_ADMIN_TOKEN_FILE
// for LLMQ_ADMIN_TOKEN, OPENAI_API_KEY_FILE for OPENAI_API_KEY (Docker and
// Kubernetes secrets are mounted as files).
const FileSuffix = "_FILE"

// secretEnv lists the LLMQ_* variables (without the prefix) that may be read
// from a file instead.
var secretEnv = []string{"ADMIN_TOKEN", "ADMIN_TOKEN_PREVIOUS", "DATABASE_URL", "REDIS_URL"}

// ReadSecret returns the value of the variable name in lookup, or, when it
// is unset or empty, the content of the file that name+"_FILE" names,
// without its trailing line break. Setting both is an error, and so is a
// file that cannot be read or is empty: an *EnvError naming the _FILE
// variable and the file, never the secret. ok is false when neither is set.
func ReadSecret(lookup func(string) (string, bool), name string) (value string, ok bool, err error) {
	v, _ := lookup(name)
	path, _ := lookup(name + FileSuffix)
	fail := func(format string, args ...any) (string, bool, error) {
		return "", false, &EnvError{Var: name + FileSuffix, Msg: fmt.Sprintf(format, args...)}
	}
	switch {
	case path == "":
		return v, v != "", nil
	case v != "":
		return fail("%s and %s%s are both set: set one", name, name, FileSuffix)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return fail("cannot read %s: %v", path, unwrapPathError(err))
	}
	s := strings.TrimRight(string(data), "\r\n")
	if s == "" {
		return fail("%s is empty", path)
	}
	return s, true, nil
}

// SecretLookup returns lookup reading each variable from its _FILE as
// ReadSecret does; a file that cannot be read counts as unset (CheckAPIKeys,
// run at start, says why).
func SecretLookup(lookup func(string) (string, bool)) func(string) (string, bool) {
	return func(name string) (string, bool) {
		v, ok, err := ReadSecret(lookup, name)
		return v, ok && err == nil
	}
}

// readSecretFiles replaces, in vars, each secret LLMQ_* variable whose
// _FILE is set by the file's content, so the rest of LoadEnv sees the value.
func readSecretFiles(vars map[string]string) error {
	lookup := func(k string) (string, bool) { v, ok := vars[k]; return v, ok }
	for _, name := range secretEnv {
		full := EnvPrefix + name
		if vars[full+FileSuffix] == "" {
			continue
		}
		v, _, err := ReadSecret(lookup, full)
		if err != nil {
			return err
		}
		vars[full] = v
	}
	return nil
}
