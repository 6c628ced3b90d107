package limiter

import (
	"io/fs"
	"os"
	"regexp"
	"testing"
)

// Every constant of luaConstants is used by a script, and every name in
// capitals a script's code uses (outside comments and strings) is one of
// them: a constant misspelt in Lua would otherwise read as a global, which
// Redis refuses only when the script runs.
func TestLuaConstants(t *testing.T) {
	defined := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^local ([A-Z][A-Z0-9_]*) = `).FindAllStringSubmatch(luaConstants, -1) {
		defined[m[1]] = true
	}
	if len(defined) == 0 {
		t.Fatal("luaConstants defines nothing")
	}
	files, err := fs.Glob(os.DirFS("."), "*.lua")
	if err != nil || len(files) == 0 {
		t.Fatalf("no .lua files: %v", err)
	}
	comment := regexp.MustCompile(`--.*`)
	quoted := regexp.MustCompile(`'[^']*'|"[^"]*"`)
	capitals := regexp.MustCompile(`\b[A-Z][A-Z0-9_]*[A-Z0-9]\b`)
	used := map[string]bool{}
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		code := quoted.ReplaceAllString(comment.ReplaceAllString(string(src), ""), "''")
		for _, name := range capitals.FindAllString(code, -1) {
			if name == "KEYS" || name == "ARGV" {
				continue
			}
			if !defined[name] {
				t.Errorf("%s uses %s, which luaConstants does not define", f, name)
			}
			used[name] = true
		}
	}
	for name := range defined {
		if !used[name] {
			t.Errorf("luaConstants defines %s, which no script uses", name)
		}
	}
}
