package main

import (
	"encoding/json"
	"fmt"
	"io"
	"iter"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/cmdline"
)

// printJSON prints what a call returned, v as indented JSON or err.
func (c *cli) printJSON(v any, err error) error {
	if err != nil {
		return err
	}
	enc := json.NewEncoder(c.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// printList prints the items of seq as a table under header, or with
// --json as JSON lines (so --all streams). An error on the first page (a
// wrong key) prints nothing, not even the header.
func printList[T any](c *cli, seq iter.Seq2[*T, error], header string, row func(*T) string) error {
	if c.json {
		enc := json.NewEncoder(c.stdout)
		for item, err := range seq {
			if err != nil {
				return err
			}
			if err := enc.Encode(item); err != nil {
				return err
			}
		}
		return nil
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	rows := 0
	for item, err := range seq {
		if err != nil {
			tw.Flush() // the rows of the pages that came are good
			return err
		}
		if rows == 0 {
			fmt.Fprintln(tw, header)
		}
		rows++
		fmt.Fprintln(tw, printable(row(item)))
	}
	if rows == 0 {
		fmt.Fprintln(tw, header)
	}
	return tw.Flush()
}

// printable escapes the control and invisible formatting characters of a
// row (CR, ESC, U+202E in a tenant name), so the terminal shows them
// instead of acting on them. Tabs, the table's separators, stay.
func printable(s string) string {
	var b strings.Builder
	for _, r := range s {
		if r != '\t' && (unicode.IsControl(r) || unicode.Is(unicode.Cf, r)) {
			fmt.Fprintf(&b, "\\u%04x", r)
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// dollars prints an amount with the precision costs of single requests
// need, without trailing zeros past the cents.
func dollars(v float64) string {
	s := strconv.FormatFloat(v, 'f', 6, 64)
	s = strings.TrimRight(s, "0")
	if i := strings.IndexByte(s, '.'); len(s)-i < 3 {
		s += strings.Repeat("0", 3-(len(s)-i))
	}
	return "$" + s
}

// when prints a Unix time in the local zone.
func when(unix int64) string {
	if unix == 0 {
		return "-"
	}
	return time.Unix(unix, 0).Local().Format("2006-01-02 15:04:05")
}

// parseUSD reads --budget, for a tenant's DailyBudgetUSD.
func parseUSD(s string) (*float64, error) {
	v, err := strconv.ParseFloat(strings.TrimPrefix(s, "$"), 64)
	if err != nil || v <= 0 || math.IsInf(v, 0) {
		return nil, cmdline.Usagef("--budget: %q is not a positive number of dollars", s)
	}
	return &v, nil
}

// open opens path, or stdin for "-", and returns the name to upload it under.
func (c *cli) open(path string) (io.ReadCloser, string, error) {
	if path == "-" {
		return io.NopCloser(c.stdin), "stdin.jsonl", nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, "", fmt.Errorf("cannot read %s: %w", path, unwrapPath(err))
	}
	if st, err := f.Stat(); err == nil && st.IsDir() {
		f.Close()
		return nil, "", fmt.Errorf("cannot read %s: it is a directory", path)
	}
	return f, filepath.Base(path), nil
}

// unwrapPath drops the path an *os.PathError repeats.
func unwrapPath(err error) error {
	if pe, ok := err.(*os.PathError); ok {
		return pe.Err
	}
	return err
}

// download saves the content of file id to path (see save).
func (c *cli) download(cl *client.Client, id, path, what string) error {
	body, err := cl.Files.Content(c.ctx, id)
	if err != nil {
		return err
	}
	defer body.Close()
	err = c.save(path, what, body)
	if err != nil && path == "-" {
		return fmt.Errorf("reading file %s: %w", id, err)
	}
	return err
}

// save writes r to path ("-" is stdout, "" nowhere) and tells stderr it
// wrote what there ("" tells nothing).
func (c *cli) save(path, what string, r io.Reader) error {
	switch path {
	case "":
		return nil
	case "-":
		_, err := io.Copy(c.stdout, r)
		return err
	}
	n, err := writeFile(path, r)
	if err == nil && what != "" {
		fmt.Fprintf(c.stderr, "wrote %s to %s (%d bytes)\n", what, path, n)
	}
	return err
}

// writeFile writes r to path through a temporary file beside it, renamed
// into place, so a reader never sees half of it.
func writeFile(path string, r io.Reader) (int64, error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return 0, fmt.Errorf("cannot write %s: %w", path, unwrapPath(err))
	}
	n, err := io.Copy(tmp, r)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		_ = os.Remove(tmp.Name())
		return n, fmt.Errorf("writing %s: %w", path, err)
	}
	return n, nil
}
