package config

import (
	"fmt"
	"os"
	"strings"
)

// FileSuffix ends the name of a variable holding the path of a file whose
// content is the secret of the variable without it (LLMQ_ADMIN_TOKEN_FILE).
const FileSuffix = "_FILE"

// secretEnv lists the LLMQ_* variables that may be read from a file.
var secretEnv = []string{"ADMIN_TOKEN", "ADMIN_TOKEN_PREVIOUS", "DATABASE_URL", "REDIS_URL"}

// ReadSecret returns the value of the variable name in lookup, else the
// content of the file name+"_FILE" names, without its trailing line break.
// Both set, or a file unreadable or empty, is an *EnvError that never holds
// the secret. ok is false when neither is set.
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

// SecretLookup returns lookup reading each variable as ReadSecret does; an
// error counts as unset (CheckAPIKeys says why).
func SecretLookup(lookup func(string) (string, bool)) func(string) (string, bool) {
	return func(name string) (string, bool) {
		v, ok, err := ReadSecret(lookup, name)
		return v, ok && err == nil
	}
}

// readSecretFiles sets, in vars, each secret LLMQ_* variable whose _FILE is
// set to the file's content.
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
