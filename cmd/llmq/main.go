// Command llmq is the user's command line over llmq's HTTP API: submit a
// batch file and watch it run with a progress bar, read jobs, batches,
// files and the day's spend, and (with the admin token) manage tenants and
// their keys. It is a thin layer over the Go client in package client.
//
// Configuration comes from LLMQ_URL (default http://127.0.0.1:8080),
// LLMQ_API_KEY and LLMQ_ADMIN_TOKEN; the flags --url, --api-key and
// --admin-token override them.
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/cmdline"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Environ(), os.Stdin, os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "llmq: "+message(err))
		os.Exit(exitCode(err))
	}
}

const defaultURL = "http://127.0.0.1:8080"

const usage = `usage: llmq COMMAND [ARGUMENTS] [FLAGS]

Jobs and batches (tenant key: LLMQ_API_KEY or --api-key):
  submit FILE                 upload an OpenAI batch input file (JSON lines of
                              custom_id, method, url, body; "-" reads stdin)
                              and create a batch; prints its id
      --wait                  follow it with a progress bar until it ends
      --out FILE              then write the output file ("-": stdout; implies --wait)
      --errors FILE           then write the error file (implies --wait)
      --poll DURATION         how often --wait asks (default 1s)
      --quiet                 no progress bar
      --endpoint URL          the batch's endpoint (default: the first line's url)
      --metadata KEY=VALUE    metadata of the batch (or jobs); repeatable
      --jobs                  send each line as a job (POST /v1/jobs) instead;
                              every line is checked before any is sent, and a
                              line sent again returns its first job
                              (--no-dedupe sends it anew)
      --concurrency N         jobs sent at once with --jobs (default 8)
  batches [list]              list batches (--limit N, --after ID, --all)
  batches get ID              show a batch
  batches cancel ID           cancel a batch
  jobs list                   list jobs (--status S, --batch ID, --limit N,
                              --after ID for the next page, --all)
  jobs get ID                 show a job with its response, usage and cost
  jobs cancel ID              cancel a job that has not finished
  jobs wait ID                wait until a job finishes, then show it
  files upload FILE           upload a batch input file; prints its id
  files list                  list files (--purpose batch|batch_output,
                              --limit N, --after ID, --all)
  files get ID                show a file
  files content ID            write a file's content to stdout (or --out FILE)
  files delete ID             delete an uploaded file no batch uses
  usage                       today's spend, reservations and budget

Administration (admin token: LLMQ_ADMIN_TOKEN or --admin-token):
  admin tenants create --name NAME --tier TIER [--budget USD] [--api-exempt]
  admin tenants list [--limit N, --after ID, --all] | get ID
  admin tenants update ID [--name NAME] [--tier TIER] [--budget USD|tier] [--api-exempt=BOOL]
  admin tenants rotate-webhook-secret ID [--overlap 24h]  a new webhook secret; the old one signs beside it for the overlap
  admin keys create TENANT_ID  create a key; prints the key, shown only once
  admin keys list TENANT_ID | revoke KEY_ID
  admin usage [--day YYYY-MM-DD] [--tenant ID]
  admin retention              what the retention policy would purge now (nothing is purged)

Other commands:
  help [COMMAND]              this help, or one command's (also COMMAND -h)
  version                     llmq's version (also --version)

Flags of every command:
  --url URL            llmq's address (LLMQ_URL, default ` + defaultURL + `)
  --api-key KEY        tenant key (LLMQ_API_KEY)
  --admin-token TOKEN  admin token (LLMQ_ADMIN_TOKEN)
  --json               print JSON instead of tables and summaries

Exit status: 0 done; 1 failed; 2 bad usage; 3 the work ended but not all of
it succeeded (a batch or job that failed, was cancelled or expired, or
failed requests in a batch); 130 interrupted.`

const (
	exitFailed      = 1
	exitUsage       = cmdline.ExitUsage
	exitIncomplete  = 3
	exitInterrupted = 130
)

// incomplete is work that ended but did not all succeed (exitIncomplete).
type incomplete string

func (e incomplete) Error() string { return string(e) }

func incompletef(format string, args ...any) error { return incomplete(fmt.Sprintf(format, args...)) }

func exitCode(err error) int {
	var inc incomplete
	switch {
	case errors.As(err, &inc):
		return exitIncomplete
	case errors.Is(err, context.Canceled):
		return exitInterrupted
	}
	return cmdline.ExitCode(err)
}

// credentialHints name the setting to check after a refused credential.
var credentialHints = map[client.Code]string{
	client.CodeInvalidAPIKey:     " (check LLMQ_API_KEY or --api-key)",
	client.CodeInvalidAdminToken: " (check LLMQ_ADMIN_TOKEN or --admin-token)",
}

// message is the one line printed for err: what the server said, or why it
// could not be reached, with a hint at the setting to check.
func message(err error) string {
	var apiErr *client.Error
	var netErr *net.OpError
	switch {
	case errors.As(err, &apiErr):
		return fmt.Sprintf("%d %s", apiErr.StatusCode, apiErr.Message) + credentialHints[apiErr.Code]
	case errors.Is(err, context.Canceled):
		return "interrupted"
	case errors.As(err, &netErr):
		return fmt.Sprintf("cannot reach llmq: %v (check LLMQ_URL or --url)", strings.TrimPrefix(err.Error(), "llmq: "))
	}
	return strings.TrimPrefix(err.Error(), "llmq: ")
}

// cli is one run of the command, with the flags every command takes.
type cli struct {
	ctx    context.Context
	env    map[string]string
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer

	url, apiKey, adminToken string
	json                    bool
}

// run runs the command line args with the environment environ (KEY=VALUE).
func run(ctx context.Context, args, environ []string, stdin io.Reader, stdout, stderr io.Writer) error {
	c := &cli{ctx: ctx, env: map[string]string{}, stdin: stdin, stdout: stdout, stderr: stderr}
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok {
			c.env[k] = v
		}
	}
	// Common flags may come before the command too.
	fs := c.flags("llmq")
	version := fs.Bool("version", false, "")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(stdout, usage)
			return nil
		}
		return cmdline.Usagef("%v (llmq help lists the commands and flags)", err)
	}
	args = fs.Args()
	if len(args) == 0 && !*version {
		return cmdline.Usagef("no command given (llmq help lists them)")
	}
	switch cmd, args := first(args), args[min(1, len(args)):]; {
	case *version:
		cmdline.PrintVersion(stdout, "llmq")
	case wantsHelp(cmd, args):
		fmt.Fprintln(stdout, helpFor(cmd))
	case cmd == "help":
		fmt.Fprintln(stdout, helpFor(first(args)))
	case cmd == "version":
		cmdline.PrintVersion(stdout, "llmq")
	default:
		for _, top := range c.commands() {
			if top.name == cmd {
				if err := c.runCommand(cmd, &top, args, false); !errors.Is(err, cmdline.ErrHelpShown) {
					return err
				}
				return nil
			}
		}
		return cmdline.Usagef("unknown command %q (llmq help lists the commands)", cmd)
	}
	return nil
}

// wantsHelp reports whether args ask for cmd's help: -h or --help anywhere
// before "--", or help where a subcommand goes (llmq jobs help, llmq admin
// keys help); a help elsewhere may be a value (--name help).
func wantsHelp(cmd string, args []string) bool {
	for i, a := range args {
		switch {
		case a == "--":
			return false
		case cmdline.IsHelp(a) && (a != "help" || i == 0 || i == 1 && cmd == "admin"):
			return true
		}
	}
	return false
}

// helpFor is the usage of one command: its lines of the usage text, and
// the flags every command takes. Any other name gets the whole text.
func helpFor(cmd string) string {
	var lines []string
	in := false
	for _, l := range strings.Split(usage, "\n") {
		indent := len(l) - len(strings.TrimLeft(l, " "))
		switch {
		case indent == 2 && !strings.HasPrefix(strings.TrimSpace(l), "--"):
			in = strings.Fields(l)[0] == cmd
		case indent < 2:
			in = false
		}
		if in {
			lines = append(lines, l)
		}
	}
	if len(lines) == 0 {
		return usage
	}
	common := usage[strings.Index(usage, "Flags of every command:"):]
	return "usage: llmq " + cmd + " ...\n" + strings.Join(lines, "\n") + "\n\n" + common
}

// flags returns a flag set for one command with the common flags. They
// have no defaults, so help never prints a key taken from the environment:
// connect resolves them.
func (c *cli) flags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&c.url, "url", c.url, "")
	fs.StringVar(&c.apiKey, "api-key", c.apiKey, "")
	fs.StringVar(&c.adminToken, "admin-token", c.adminToken, "")
	fs.BoolVar(&c.json, "json", c.json, "")
	return fs
}

// parse parses args, whose flags may come before, between or after the
// positional arguments ("--" ends the flags), and checks that exactly the
// named positional arguments are there.
func (c *cli) parse(fs *flag.FlagSet, args []string, names ...string) ([]string, error) {
	var pos, rest []string
	if i := slices.Index(args, "--"); i >= 0 {
		args, rest = args[:i], args[i+1:]
	}
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				cmd, _, _ := strings.Cut(fs.Name(), " ")
				fmt.Fprintln(c.stdout, helpFor(cmd))
				return nil, cmdline.ErrHelpShown
			}
			return nil, cmdline.Usagef("%s: %v", fs.Name(), err)
		}
		args = fs.Args()
		if len(args) == 0 {
			break
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
	pos = append(pos, rest...)
	if len(pos) != len(names) {
		want := cmp.Or(strings.Join(names, " "), "no arguments")
		return nil, cmdline.Usagef("%s takes %s, got %q (see llmq help)", fs.Name(), want, pos)
	}
	return pos, nil
}

// connect returns a client of the tenant key, or of the admin token.
func (c *cli) connect(admin bool) (*client.Client, error) {
	key, opts := cmp.Or(c.apiKey, c.env["LLMQ_API_KEY"]), []client.Option{client.WithUserAgent("llmq-cli")}
	if admin {
		token := cmp.Or(c.adminToken, c.env["LLMQ_ADMIN_TOKEN"])
		if token == "" {
			return nil, cmdline.Usagef("no admin token: set LLMQ_ADMIN_TOKEN or pass --admin-token")
		}
		key, opts = "", append(opts, client.WithAdminToken(token))
	} else if key == "" {
		return nil, cmdline.Usagef("no API key: set LLMQ_API_KEY or pass --api-key")
	}
	u := cmp.Or(c.url, c.env["LLMQ_URL"], defaultURL)
	cl, err := client.New(u, key, opts...)
	if err != nil {
		return nil, cmdline.Usagef("LLMQ_URL or --url: %q is not an http(s) URL", u)
	}
	return cl, nil
}

// first is the first of args, "" when there is none.
func first(args []string) string {
	if len(args) == 0 {
		return ""
	}
	return args[0]
}
