package main

import (
	"flag"
	"fmt"
	"iter"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/llmq/llmq/client"
)

func (c *cli) jobs(args []string) error {
	sub, args := subcommand(args, "list")
	switch sub {
	case "list":
		p := client.JobListParams{}
		return listCmd(c, "jobs list", args, &p.Limit, &p.After, func(fs *flag.FlagSet) {
			fs.StringVar(&p.Status, "status", "", "")
			fs.StringVar(&p.BatchID, "batch", "", "")
		}, c.client,
			func(cl *client.Client) (*client.List[client.Job], error) { return cl.Jobs.List(c.ctx, &p) },
			func(cl *client.Client) iter.Seq2[*client.Job, error] { return cl.Jobs.All(c.ctx, &p) },
			"ID\tSTATUS\tMODEL\tCUSTOM_ID\tATTEMPTS\tCOST_USD\tCREATED", func(j *client.Job) string {
				return fmt.Sprintf("%s\t%s\t%s\t%s\t%d\t%s\t%s", j.ID, j.Status, j.Model, deref(j.CustomID), j.Attempts, dollars(j.CostUSD), when(j.CreatedAt))
			})
	case "get", "cancel", "wait":
		fs := c.flags("jobs " + sub)
		pos, err := c.parse(fs, args, "ID")
		if err != nil {
			return err
		}
		cl, err := c.client()
		if err != nil {
			return err
		}
		var j *client.Job
		switch sub {
		case "get":
			j, err = cl.Jobs.Get(c.ctx, pos[0])
		case "cancel":
			if j, err = cl.Jobs.Cancel(c.ctx, pos[0]); err == nil && !c.json {
				fmt.Fprintf(c.stdout, "%s %s\n", j.ID, j.Status)
				return nil
			}
		case "wait":
			j, err = cl.Jobs.Wait(c.ctx, pos[0], nil)
		}
		if err != nil {
			return err
		}
		if err := c.printJSON(j); err != nil {
			return err
		}
		if sub == "wait" && j.Status != "succeeded" {
			return incompletef("job %s %s", j.ID, j.Status)
		}
		return nil
	}
	return unknownSub("jobs", sub, "list, get, cancel or wait")
}

func (c *cli) batches(args []string) error {
	sub, args := subcommand(args, "list")
	switch sub {
	case "list":
		p := client.ListParams{}
		return listCmd(c, "batches list", args, &p.Limit, &p.After, nil, c.client,
			func(cl *client.Client) (*client.List[client.Batch], error) { return cl.Batches.List(c.ctx, &p) },
			func(cl *client.Client) iter.Seq2[*client.Batch, error] { return cl.Batches.All(c.ctx, &p) },
			"ID\tSTATUS\tDONE\tFAILED\tTOTAL\tENDPOINT\tCREATED", func(b *client.Batch) string {
				rc := b.RequestCounts
				return fmt.Sprintf("%s\t%s\t%d\t%d\t%d\t%s\t%s", b.ID, b.Status, rc.Completed, rc.Failed, rc.Total, b.Endpoint, when(b.CreatedAt))
			})
	case "get", "cancel":
		fs := c.flags("batches " + sub)
		pos, err := c.parse(fs, args, "ID")
		if err != nil {
			return err
		}
		cl, err := c.client()
		if err != nil {
			return err
		}
		if sub == "get" {
			b, err := cl.Batches.Get(c.ctx, pos[0])
			if err != nil {
				return err
			}
			return c.printJSON(b)
		}
		b, err := cl.Batches.Cancel(c.ctx, pos[0])
		if err != nil {
			return err
		}
		if c.json {
			return c.printJSON(b)
		}
		fmt.Fprintf(c.stdout, "%s %s\n", b.ID, b.Status)
		return nil
	}
	return unknownSub("batches", sub, "list, get or cancel")
}

func (c *cli) files(args []string) error {
	sub, args := subcommand(args, "")
	switch sub {
	case "upload":
		fs := c.flags("files upload")
		purpose := fs.String("purpose", "batch", "")
		pos, err := c.parse(fs, args, "FILE")
		if err != nil {
			return err
		}
		cl, err := c.client()
		if err != nil {
			return err
		}
		in, name, err := c.open(pos[0])
		if err != nil {
			return err
		}
		defer in.Close()
		f, err := cl.Files.Upload(c.ctx, name, in, *purpose)
		if err != nil {
			return err
		}
		if c.json {
			return c.printJSON(f)
		}
		fmt.Fprintln(c.stdout, f.ID)
		return nil
	case "list":
		p := client.FileListParams{}
		return listCmd(c, "files list", args, &p.Limit, &p.After, func(fs *flag.FlagSet) {
			fs.StringVar(&p.Purpose, "purpose", "", "")
		}, c.client,
			func(cl *client.Client) (*client.List[client.File], error) { return cl.Files.List(c.ctx, &p) },
			func(cl *client.Client) iter.Seq2[*client.File, error] { return cl.Files.All(c.ctx, &p) },
			"ID\tPURPOSE\tBYTES\tFILENAME\tCREATED", func(f *client.File) string {
				return fmt.Sprintf("%s\t%s\t%d\t%s\t%s", f.ID, f.Purpose, f.Bytes, f.Filename, when(f.CreatedAt))
			})
	case "get":
		fs := c.flags("files get")
		pos, err := c.parse(fs, args, "ID")
		if err != nil {
			return err
		}
		cl, err := c.client()
		if err != nil {
			return err
		}
		f, err := cl.Files.Get(c.ctx, pos[0])
		if err != nil {
			return err
		}
		return c.printJSON(f)
	case "delete":
		fs := c.flags("files delete")
		pos, err := c.parse(fs, args, "ID")
		if err != nil {
			return err
		}
		cl, err := c.client()
		if err != nil {
			return err
		}
		d, err := cl.Files.Delete(c.ctx, pos[0])
		if err != nil {
			return err
		}
		if c.json {
			return c.printJSON(d)
		}
		fmt.Fprintf(c.stdout, "%s deleted\n", d.ID)
		return nil
	case "content":
		fs := c.flags("files content")
		out := fs.String("out", "-", "")
		pos, err := c.parse(fs, args, "ID")
		if err != nil {
			return err
		}
		cl, err := c.client()
		if err != nil {
			return err
		}
		_, err = c.download(cl, pos[0], *out)
		return err
	}
	return unknownSub("files", sub, "upload, list, get, content or delete")
}

func (c *cli) usage(args []string) error {
	if _, err := c.parse(c.flags("usage"), args); err != nil {
		return err
	}
	cl, err := c.client()
	if err != nil {
		return err
	}
	u, err := cl.Usage(c.ctx)
	if err != nil {
		return err
	}
	if c.json {
		return c.printJSON(u)
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

func (c *cli) admin(args []string) error {
	what, args := subcommand(args, "")
	switch what {
	case "tenants":
		return c.adminTenants(args)
	case "keys":
		return c.adminKeys(args)
	case "usage":
		fs := c.flags("admin usage")
		p := client.UsageReportParams{}
		fs.StringVar(&p.Day, "day", "", "")
		fs.StringVar(&p.TenantID, "tenant", "", "")
		if _, err := c.parse(fs, args); err != nil {
			return err
		}
		cl, err := c.adminClient()
		if err != nil {
			return err
		}
		r, err := cl.Admin.UsageReport(c.ctx, &p)
		if err != nil {
			return err
		}
		if c.json {
			return c.printJSON(r)
		}
		tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintf(tw, "TENANT\tMODEL\tREQUESTS\tPROMPT_TOKENS\tCOMPLETION_TOKENS\tCOST_USD\n")
		for _, row := range r.Data {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%s\n", row.TenantID, row.Model, row.Requests, row.PromptTokens, row.CompletionTokens, dollars(row.CostUSD))
		}
		fmt.Fprintf(tw, "total %s\t\t\t\t\t%s\n", r.Day, dollars(r.TotalCostUSD))
		return tw.Flush()
	case "retention":
		if _, err := c.parse(c.flags("admin retention"), args); err != nil {
			return err
		}
		cl, err := c.adminClient()
		if err != nil {
			return err
		}
		r, err := cl.Admin.Retention(c.ctx)
		if err != nil {
			return err
		}
		if c.json {
			return c.printJSON(r)
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
	return unknownSub("admin", what, "tenants, keys, usage or retention")
}

func (c *cli) adminTenants(args []string) error {
	sub, args := subcommand(args, "list")
	switch sub {
	case "create":
		fs := c.flags("admin tenants create")
		p := client.TenantCreateParams{}
		fs.StringVar(&p.Name, "name", "", "")
		fs.StringVar(&p.Tier, "tier", "", "")
		budget := fs.String("budget", "", "")
		fs.BoolVar(&p.APIExempt, "api-exempt", false, "")
		if _, err := c.parse(fs, args); err != nil {
			return err
		}
		if p.Name == "" || p.Tier == "" {
			return usageErrorf("admin tenants create needs --name and --tier")
		}
		if *budget != "" {
			v, err := parseUSD(*budget)
			if err != nil {
				return err
			}
			p.DailyBudgetUSD = &v
		}
		cl, err := c.adminClient()
		if err != nil {
			return err
		}
		t, err := cl.Admin.CreateTenant(c.ctx, &p)
		if err != nil {
			return err
		}
		if c.json {
			return c.printJSON(t)
		}
		fmt.Fprintln(c.stdout, t.ID)
		return nil
	case "list":
		p := client.ListParams{}
		return listCmd(c, "admin tenants list", args, &p.Limit, &p.After, nil, c.adminClient,
			func(cl *client.Client) (*client.List[client.Tenant], error) { return cl.Admin.ListTenants(c.ctx, &p) },
			func(cl *client.Client) iter.Seq2[*client.Tenant, error] { return cl.Admin.AllTenants(c.ctx, &p) },
			"ID\tNAME\tTIER\tBUDGET_USD\tCREATED", func(t *client.Tenant) string {
				b := "tier's"
				if t.DailyBudgetUSD != nil {
					b = dollars(*t.DailyBudgetUSD)
				}
				return fmt.Sprintf("%s\t%s\t%s\t%s\t%s", t.ID, t.Name, t.Tier, b, when(t.CreatedAt))
			})
	case "get":
		fs := c.flags("admin tenants get")
		pos, err := c.parse(fs, args, "ID")
		if err != nil {
			return err
		}
		cl, err := c.adminClient()
		if err != nil {
			return err
		}
		t, err := cl.Admin.GetTenant(c.ctx, pos[0])
		if err != nil {
			return err
		}
		return c.printJSON(t)
	case "update":
		fs := c.flags("admin tenants update")
		name := fs.String("name", "", "")
		tier := fs.String("tier", "", "")
		budget := fs.String("budget", "", "")
		exempt := fs.Bool("api-exempt", false, "")
		pos, err := c.parse(fs, args, "ID")
		if err != nil {
			return err
		}
		p := client.TenantUpdateParams{}
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		if set["name"] {
			p.Name = name
		}
		if set["tier"] {
			p.Tier = tier
		}
		if set["api-exempt"] {
			p.APIExempt = exempt
		}
		if set["budget"] {
			if *budget == "tier" {
				p.ClearDailyBudget = true
			} else {
				v, err := parseUSD(*budget)
				if err != nil {
					return err
				}
				p.DailyBudgetUSD = &v
			}
		}
		if len(set) == 0 || (!set["name"] && !set["tier"] && !set["api-exempt"] && !set["budget"]) {
			return usageErrorf("admin tenants update needs --name, --tier, --budget or --api-exempt")
		}
		cl, err := c.adminClient()
		if err != nil {
			return err
		}
		t, err := cl.Admin.UpdateTenant(c.ctx, pos[0], &p)
		if err != nil {
			return err
		}
		return c.printJSON(t)
	case "rotate-webhook-secret":
		fs := c.flags("admin tenants rotate-webhook-secret")
		overlap := fs.Duration("overlap", 24*time.Hour, "")
		pos, err := c.parse(fs, args, "ID")
		if err != nil {
			return err
		}
		cl, err := c.adminClient()
		if err != nil {
			return err
		}
		t, err := cl.Admin.RotateWebhookSecret(c.ctx, pos[0], *overlap)
		if err != nil {
			return err
		}
		return c.printJSON(t)
	}
	return unknownSub("admin tenants", sub, "create, list, get, update or rotate-webhook-secret")
}

func (c *cli) adminKeys(args []string) error {
	sub, args := subcommand(args, "")
	switch sub {
	case "create", "list", "revoke":
	default:
		return unknownSub("admin keys", sub, "create, list or revoke")
	}
	fs := c.flags("admin keys " + sub)
	arg := "TENANT_ID"
	if sub == "revoke" {
		arg = "KEY_ID"
	}
	pos, err := c.parse(fs, args, arg)
	if err != nil {
		return err
	}
	cl, err := c.adminClient()
	if err != nil {
		return err
	}
	switch sub {
	case "create":
		k, err := cl.Admin.CreateKey(c.ctx, pos[0])
		if err != nil {
			return err
		}
		if c.json {
			return c.printJSON(k)
		}
		// The key alone on stdout, for KEY=$(llmq admin keys create …).
		fmt.Fprintln(c.stdout, k.Key)
		fmt.Fprintf(c.stderr, "key %s of %s: keep it now, llmq shows it only once\n", k.ID, k.TenantID)
		return nil
	case "list":
		l, err := cl.Admin.ListKeys(c.ctx, pos[0])
		if err != nil {
			return err
		}
		return printList(c, func(yield func(*client.APIKey, error) bool) {
			for i := range l.Data {
				if !yield(&l.Data[i], nil) {
					return
				}
			}
		}, "ID\tPREFIX\tCREATED\tREVOKED", func(k *client.APIKey) string {
			revoked := "-"
			if k.RevokedAt != nil {
				revoked = when(*k.RevokedAt)
			}
			return fmt.Sprintf("%s\t%s…\t%s\t%s", k.ID, k.Prefix, when(k.CreatedAt), revoked)
		})
	default:
		k, err := cl.Admin.RevokeKey(c.ctx, pos[0])
		if err != nil {
			return err
		}
		if c.json {
			return c.printJSON(k)
		}
		fmt.Fprintf(c.stdout, "%s revoked\n", k.ID)
		return nil
	}
}

// unknownSub is the usage error of a command whose subcommand is missing
// or unknown.
func unknownSub(cmd, sub, subs string) error {
	top, _, _ := strings.Cut(cmd, " ")
	if sub == "" {
		return usageErrorf("%s needs a subcommand: %s (llmq %s -h)", cmd, subs, top)
	}
	return usageErrorf("unknown command \"%s %s\": use %s (llmq %s -h)", cmd, sub, subs, top)
}

// listCmd runs a list command: the command's own flags (extra), --limit,
// --after and --all (every page, 100 a request), printed as a table of
// header and row, or as JSON lines.
func listCmd[T any](c *cli, name string, args []string, limit *int, after *string, extra func(*flag.FlagSet),
	connect func() (*client.Client, error), page func(*client.Client) (*client.List[T], error),
	all func(*client.Client) iter.Seq2[*T, error], header string, row func(*T) string) error {
	fs := c.flags(name)
	if extra != nil {
		extra(fs)
	}
	fs.IntVar(limit, "limit", 0, "")
	fs.StringVar(after, "after", "", "")
	every := fs.Bool("all", false, "")
	if _, err := c.parse(fs, args); err != nil {
		return err
	}
	cl, err := connect()
	if err != nil {
		return err
	}
	seq := onePage(c, func() (*client.List[T], error) { return page(cl) })
	if *every {
		if *limit == 0 {
			*limit = 100 // fewer round trips than the default 20
		}
		seq = all(cl)
	}
	return printList(c, seq, header, row)
}

// onePage is the sequence of one page's items; after the last it says on
// stderr how to see more, when there is more.
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
