// Package tenant is the router's per-tenant accounting, kept pure (no I/O,
// no clock: every call takes the time) so it is unit-testable:
//
//   - Keys parses the API keys file (hashed keys, each naming a tenant and
//     its default priority class) and the tenants' budgets.
//   - Ledger counts each tenant's input and output tokens over a sliding
//     one-minute window and its concurrent requests, admits or refuses a
//     request against the tenant's Budget, corrects the count with the
//     engine's reported usage, and adds what peer instances report (the
//     cluster shares absolute per-tenant usage, so a fleet enforces one
//     budget).
//   - Scheduler is the fair queue's order: strict priority between
//     classes, deficit round-robin on estimated tokens between tenants
//     within a class.
//
// slowpath wires them to requests, the keys file's reloads and the cluster.
package tenant
