package budget

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/llmq/llmq/internal/money"
)

// Charge is one job's ledger row, as an audit reads it.
type Charge struct {
	JobID     string
	TenantID  string
	Day       string // the tenant's budget day
	GlobalDay string // the UTC day
	Cost      money.Micros
	WrittenAt time.Time
}

// Audit charges each of the ledger's rows that its days' spend in Redis
// does not count, and returns how many it charged and their sum. A row is
// written before its settlement, so Redis counts less than the ledger only
// when it lost settlements (a failover to a replica that lagged, an old
// master that took writes after its replica's promotion, an AOF that lost
// its last second) or while a settlement is in flight: Audit settles such a
// row as its worker would, and the job's own settlement then finds it
// charged. A day Redis lost whole is left to its rebuild from the ledger,
// and so is a row a rebuild counted.
func (b *Budgets) Audit(ctx context.Context, rows []Charge) (charged int, sum money.Micros, err error) {
	for _, c := range rows {
		if c.Cost < 0 {
			return charged, sum, fmt.Errorf("budget: Audit %s: negative cost %s", c.JobID, c.Cost)
		}
		res := &Reservation{ID: c.JobID, TenantID: c.TenantID, Day: c.Day, GlobalDay: c.GlobalDay}
		n, err := b.settleDays(ctx, res, c.Cost, true, strconv.FormatInt(c.WrittenAt.UnixMicro(), 10), true, true)
		if err != nil {
			return charged, sum, fmt.Errorf("budget: Audit %s: %w", c.JobID, err)
		}
		if n[0] == 1 || n[1] == 1 {
			charged++
			sum += c.Cost
		}
	}
	if charged > 0 {
		b.log.Warn("budget: charged ledger rows Redis had lost the settlement of", "rows", charged, "usd", sum.USD())
	}
	return charged, sum, nil
}
