package main

import (
	"flag"
	"fmt"
	"iter"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/cmdline"
)

// command is a group of subcommands, or a leaf run with its flags and arguments.
type command struct {
	name string

	// A group: its subcommands, in the order its usage names them, and the
	// one run when none is given ("" for none).
	subs []command
	def  string

	admin bool                      // the command and its subcommands call with the admin token
	args  []string                  // names of the leaf's positional arguments
	flags func(*flag.FlagSet)       // adds the leaf's own flags
	check func(*flag.FlagSet) error // checks them before the client is made
	run   func(*client.Client, []string) error
}

// commands is the CLI's table of commands. Their flags are bound to
// variables of this call: one command runs per process.
func (c *cli) commands() []command {
	var (
		jobList      client.JobListParams
		batchList    client.ListParams
		fileList     client.FileListParams
		purpose, out string
		report       client.UsageReportParams
	)
	return []command{
		c.submitCommand(),
		{name: "jobs", def: "list", subs: []command{
			list(c, &jobList.Limit, &jobList.After, func(fs *flag.FlagSet) {
				fs.StringVar(&jobList.Status, "status", "", "")
				fs.StringVar(&jobList.BatchID, "batch", "", "")
			},
				func(cl *client.Client) (*client.List[client.Job], error) { return cl.Jobs.List(c.ctx, &jobList) },
				func(cl *client.Client) iter.Seq2[*client.Job, error] { return cl.Jobs.All(c.ctx, &jobList) },
				"ID\tSTATUS\tMODEL\tCUSTOM_ID\tATTEMPTS\tCOST_USD\tCREATED", func(j *client.Job) string {
					return fmt.Sprintf("%s\t%s\t%s\t%s\t%d\t%s\t%s", j.ID, j.Status, j.Model, deref(j.CustomID), j.Attempts, dollars(j.CostUSD), when(j.CreatedAt))
				}),
			{name: "get", args: id, run: func(cl *client.Client, pos []string) error {
				return c.printJSON(cl.Jobs.Get(c.ctx, pos[0]))
			}},
			{name: "cancel", args: id, run: func(cl *client.Client, pos []string) error {
				return reply(c, func(j *client.Job) string { return j.ID + " " + j.Status })(cl.Jobs.Cancel(c.ctx, pos[0]))
			}},
			{name: "wait", args: id, run: func(cl *client.Client, pos []string) error {
				j, err := cl.Jobs.Wait(c.ctx, pos[0], nil)
				if err := c.printJSON(j, err); err != nil {
					return err
				}
				if j.Status != "succeeded" {
					return incompletef("job %s %s", j.ID, j.Status)
				}
				return nil
			}},
		}},
		{name: "batches", def: "list", subs: []command{
			list(c, &batchList.Limit, &batchList.After, nil,
				func(cl *client.Client) (*client.List[client.Batch], error) { return cl.Batches.List(c.ctx, &batchList) },
				func(cl *client.Client) iter.Seq2[*client.Batch, error] { return cl.Batches.All(c.ctx, &batchList) },
				"ID\tSTATUS\tDONE\tFAILED\tTOTAL\tENDPOINT\tCREATED", func(b *client.Batch) string {
					rc := b.RequestCounts
					return fmt.Sprintf("%s\t%s\t%d\t%d\t%d\t%s\t%s", b.ID, b.Status, rc.Completed, rc.Failed, rc.Total, b.Endpoint, when(b.CreatedAt))
				}),
			{name: "get", args: id, run: func(cl *client.Client, pos []string) error {
				return c.printJSON(cl.Batches.Get(c.ctx, pos[0]))
			}},
			{name: "cancel", args: id, run: func(cl *client.Client, pos []string) error {
				return reply(c, func(b *client.Batch) string { return b.ID + " " + b.Status })(cl.Batches.Cancel(c.ctx, pos[0]))
			}},
		}},
		{name: "files", subs: []command{
			{name: "upload", args: []string{"FILE"}, flags: func(fs *flag.FlagSet) { fs.StringVar(&purpose, "purpose", "batch", "") },
				run: func(cl *client.Client, pos []string) error {
					in, name, err := c.open(pos[0])
					if err != nil {
						return err
					}
					defer in.Close()
					return reply(c, func(f *client.File) string { return f.ID })(cl.Files.Upload(c.ctx, name, in, purpose))
				}},
			list(c, &fileList.Limit, &fileList.After, func(fs *flag.FlagSet) {
				fs.StringVar(&fileList.Purpose, "purpose", "", "")
			},
				func(cl *client.Client) (*client.List[client.File], error) { return cl.Files.List(c.ctx, &fileList) },
				func(cl *client.Client) iter.Seq2[*client.File, error] { return cl.Files.All(c.ctx, &fileList) },
				"ID\tPURPOSE\tBYTES\tFILENAME\tCREATED", func(f *client.File) string {
					return fmt.Sprintf("%s\t%s\t%d\t%s\t%s", f.ID, f.Purpose, f.Bytes, f.Filename, when(f.CreatedAt))
				}),
			{name: "get", args: id, run: func(cl *client.Client, pos []string) error {
				return c.printJSON(cl.Files.Get(c.ctx, pos[0]))
			}},
			{name: "content", args: id, flags: func(fs *flag.FlagSet) { fs.StringVar(&out, "out", "-", "") },
				run: func(cl *client.Client, pos []string) error {
					return c.download(cl, pos[0], out, "")
				}},
			{name: "delete", args: id, run: func(cl *client.Client, pos []string) error {
				return reply(c, func(d *client.FileDeleted) string { return d.ID + " deleted" })(cl.Files.Delete(c.ctx, pos[0]))
			}},
		}},
		{name: "usage", run: c.usage},
		{name: "admin", admin: true, subs: []command{
			{name: "tenants", def: "list", subs: c.tenantCommands()},
			{name: "keys", subs: c.keyCommands()},
			{name: "usage", flags: func(fs *flag.FlagSet) {
				fs.StringVar(&report.Day, "day", "", "")
				fs.StringVar(&report.TenantID, "tenant", "", "")
			}, run: func(cl *client.Client, _ []string) error { return c.usageReport(cl, &report) }},
			{name: "retention", run: c.retention},
		}},
	}
}

// id is the positional argument of the commands on one object.
var id = []string{"ID"}

func (c *cli) tenantCommands() []command {
	var (
		page       client.ListParams
		create     client.TenantCreateParams
		update     client.TenantUpdateParams
		name, tier string
		budget     string
		exempt     bool
		overlap    time.Duration
	)
	return []command{
		{name: "create", flags: func(fs *flag.FlagSet) {
			fs.StringVar(&create.Name, "name", "", "")
			fs.StringVar(&create.Tier, "tier", "", "")
			fs.StringVar(&budget, "budget", "", "")
			fs.BoolVar(&create.APIExempt, "api-exempt", false, "")
		}, check: func(*flag.FlagSet) (err error) {
			if create.Name == "" || create.Tier == "" {
				return cmdline.Usagef("admin tenants create needs --name and --tier")
			}
			if budget != "" {
				create.DailyBudgetUSD, err = parseUSD(budget)
			}
			return err
		}, run: func(cl *client.Client, _ []string) error {
			return reply(c, func(t *client.Tenant) string { return t.ID })(cl.Admin.CreateTenant(c.ctx, &create))
		}},
		list(c, &page.Limit, &page.After, nil,
			func(cl *client.Client) (*client.List[client.Tenant], error) {
				return cl.Admin.ListTenants(c.ctx, &page)
			},
			func(cl *client.Client) iter.Seq2[*client.Tenant, error] { return cl.Admin.AllTenants(c.ctx, &page) },
			"ID\tNAME\tTIER\tBUDGET_USD\tCREATED", func(t *client.Tenant) string {
				b := "tier's"
				if t.DailyBudgetUSD != nil {
					b = dollars(*t.DailyBudgetUSD)
				}
				return fmt.Sprintf("%s\t%s\t%s\t%s\t%s", t.ID, t.Name, t.Tier, b, when(t.CreatedAt))
			}),
		{name: "get", args: id, run: func(cl *client.Client, pos []string) error {
			return c.printJSON(cl.Admin.GetTenant(c.ctx, pos[0]))
		}},
		{name: "update", args: id, flags: func(fs *flag.FlagSet) {
			fs.StringVar(&name, "name", "", "")
			fs.StringVar(&tier, "tier", "", "")
			fs.StringVar(&budget, "budget", "", "")
			fs.BoolVar(&exempt, "api-exempt", false, "")
		}, check: func(fs *flag.FlagSet) (err error) {
			fs.Visit(func(f *flag.Flag) {
				switch f.Name {
				case "name":
					update.Name = &name
				case "tier":
					update.Tier = &tier
				case "api-exempt":
					update.APIExempt = &exempt
				case "budget":
					update.ClearDailyBudget = budget == "tier"
					if !update.ClearDailyBudget {
						update.DailyBudgetUSD, err = parseUSD(budget)
					}
				}
			})
			if err == nil && update == (client.TenantUpdateParams{}) {
				return cmdline.Usagef("admin tenants update needs --name, --tier, --budget or --api-exempt")
			}
			return err
		}, run: func(cl *client.Client, pos []string) error {
			return c.printJSON(cl.Admin.UpdateTenant(c.ctx, pos[0], &update))
		}},
		{name: "rotate-webhook-secret", args: id, flags: func(fs *flag.FlagSet) {
			fs.DurationVar(&overlap, "overlap", 24*time.Hour, "")
		}, run: func(cl *client.Client, pos []string) error {
			return c.printJSON(cl.Admin.RotateWebhookSecret(c.ctx, pos[0], overlap))
		}},
	}
}

func (c *cli) keyCommands() []command {
	tenant, key := []string{"TENANT_ID"}, []string{"KEY_ID"}
	return []command{
		{name: "create", args: tenant, run: func(cl *client.Client, pos []string) error {
			k, err := cl.Admin.CreateKey(c.ctx, pos[0])
			if err != nil || c.json {
				return c.printJSON(k, err)
			}
			// The key alone on stdout, for KEY=$(llmq admin keys create …).
			fmt.Fprintln(c.stdout, k.Key)
			fmt.Fprintf(c.stderr, "key %s of %s: keep it now, llmq shows it only once\n", k.ID, k.TenantID)
			return nil
		}},
		{name: "list", args: tenant, run: func(cl *client.Client, pos []string) error {
			keys := func() (*client.List[client.APIKey], error) { return cl.Admin.ListKeys(c.ctx, pos[0]) }
			return printList(c, onePage(c, keys), "ID\tPREFIX\tCREATED\tREVOKED", func(k *client.APIKey) string {
				revoked := "-"
				if k.RevokedAt != nil {
					revoked = when(*k.RevokedAt)
				}
				return fmt.Sprintf("%s\t%s…\t%s\t%s", k.ID, k.Prefix, when(k.CreatedAt), revoked)
			})
		}},
		{name: "revoke", args: key, run: func(cl *client.Client, pos []string) error {
			return reply(c, func(k *client.APIKey) string { return k.ID + " revoked" })(cl.Admin.RevokeKey(c.ctx, pos[0]))
		}},
	}
}

// runCommand runs cmd, named path ("admin tenants"), with args.
func (c *cli) runCommand(path string, cmd *command, args []string, admin bool) error {
	admin = admin || cmd.admin
	if cmd.subs != nil {
		sub, rest := cmd.def, args
		if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
			sub, rest = args[0], args[1:]
		}
		names := make([]string, len(cmd.subs))
		for i := range cmd.subs {
			if cmd.subs[i].name == sub {
				return c.runCommand(path+" "+sub, &cmd.subs[i], rest, admin)
			}
			names[i] = cmd.subs[i].name
		}
		subs := strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
		top, _, _ := strings.Cut(path, " ")
		if sub == "" {
			return cmdline.Usagef("%s needs a subcommand: %s (llmq %s -h)", path, subs, top)
		}
		return cmdline.Usagef("unknown command \"%s %s\": use %s (llmq %s -h)", path, sub, subs, top)
	}
	fs := c.flags(path)
	if cmd.flags != nil {
		cmd.flags(fs)
	}
	pos, err := c.parse(fs, args, cmd.args...)
	if err != nil {
		return err
	}
	if cmd.check != nil {
		if err := cmd.check(fs); err != nil {
			return err
		}
	}
	cl, err := c.connect(admin)
	if err != nil {
		return err
	}
	return cmd.run(cl, pos)
}

// reply prints what a call returned: line(v), or with --json v as JSON.
func reply[T any](c *cli, line func(*T) string) func(*T, error) error {
	return func(v *T, err error) error {
		if err != nil || c.json {
			return c.printJSON(v, err)
		}
		fmt.Fprintln(c.stdout, line(v))
		return nil
	}
}

// list is a list command: its own flags (extra), --limit, --after and --all
// (every page, 100 a request).
func list[T any](c *cli, limit *int, after *string, extra func(*flag.FlagSet),
	page func(*client.Client) (*client.List[T], error), all func(*client.Client) iter.Seq2[*T, error],
	header string, row func(*T) string) command {
	every := false
	return command{name: "list", flags: func(fs *flag.FlagSet) {
		if extra != nil {
			extra(fs)
		}
		fs.IntVar(limit, "limit", 0, "")
		fs.StringVar(after, "after", "", "")
		fs.BoolVar(&every, "all", false, "")
	}, run: func(cl *client.Client, _ []string) error {
		seq := onePage(c, func() (*client.List[T], error) { return page(cl) })
		if every {
			if *limit == 0 {
				*limit = 100 // fewer round trips than the default 20
			}
			seq = all(cl)
		}
		return printList(c, seq, header, row)
	}}
}

// onePage yields one page's items, then tells stderr how to see more.
func onePage[T any](c *cli, page func() (*client.List[T], error)) iter.Seq2[*T, error] {
	return func(yield func(*T, error) bool) {
		l, err := page()
		if err != nil {
			yield(nil, err)
			return
		}
		for i := range l.Data {
			if !yield(&l.Data[i], nil) {
				return
			}
		}
		if l.HasMore && l.LastID != nil {
			fmt.Fprintf(c.stderr, "more: --after %s for the next page, or --all\n", *l.LastID)
		}
	}
}

func (c *cli) usage(cl *client.Client, _ []string) error {
	u, err := cl.Usage(c.ctx)
	if err != nil || c.json {
		return c.printJSON(u, err)
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "tenant\t%s (tier %s)\n", u.Tenant, u.Tier)
	fmt.Fprintf(tw, "day\t%s, resets %s\n", u.Day, when(u.ResetsAt))
	fmt.Fprintf(tw, "spent\t%s\n", dollars(u.SpentUSD))
	fmt.Fprintf(tw, "reserved\t%s\n", dollars(u.ReservedUSD))
	if u.BudgetUSD == nil {
		fmt.Fprintf(tw, "budget\tunlimited\n")
	} else {
		fmt.Fprintf(tw, "budget\t%s\n", dollars(*u.BudgetUSD))
		fmt.Fprintf(tw, "remaining\t%s\n", dollars(deref(u.RemainingUSD)))
	}
	if u.SoftLimitReached {
		fmt.Fprintf(tw, "warning\tthe soft limit of the budget is reached\n")
	}
	return tw.Flush()
}

func (c *cli) usageReport(cl *client.Client, p *client.UsageReportParams) error {
	r, err := cl.Admin.UsageReport(c.ctx, p)
	if err != nil || c.json {
		return c.printJSON(r, err)
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "TENANT\tMODEL\tREQUESTS\tPROMPT_TOKENS\tCOMPLETION_TOKENS\tCOST_USD\n")
	for _, row := range r.Data {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%s\n", row.TenantID, row.Model, row.Requests, row.PromptTokens, row.CompletionTokens, dollars(row.CostUSD))
	}
	fmt.Fprintf(tw, "total %s\t\t\t\t\t%s\n", r.Day, dollars(r.TotalCostUSD))
	return tw.Flush()
}

func (c *cli) retention(cl *client.Client, _ []string) error {
	r, err := cl.Admin.Retention(c.ctx)
	if err != nil || c.json {
		return c.printJSON(r, err)
	}
	before := func(unix *int64) string {
		if unix == nil {
			return "kept for ever (retention 0)"
		}
		return "older than " + time.Unix(*unix, 0).UTC().Format(time.RFC3339)
	}
	fmt.Fprintf(c.stdout, "finished jobs (retention %s): %d would lose their request and response, %s\n", r.FinishedJobs, r.Jobs, before(r.JobsBefore))
	fmt.Fprintf(c.stdout, "files (retention %s): %d files, %d bytes would be deleted, %s\n", r.Files, r.FileCount, r.FileBytes, before(r.FilesBefore))
	fmt.Fprintf(c.stdout, "usage ledger (retention %s): %d rows would be folded into daily totals, %s\n", r.Ledger, r.LedgerRows, before(r.LedgerBefore))
	return nil
}
