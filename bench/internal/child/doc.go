// Package child runs the benches' child processes: each in its own process
// group with a parent-death signal (SIGKILL), stopped as a group (SIGTERM,
// then SIGKILL after a grace period), with the end of its output kept for
// error messages. bench/live and bench/llamacpp share it, so every process
// a bench starts is reported to one hook (OnStart) that tests use to assert
// nothing outlives a run.
//
// Lifecycle hazards: FreeAddr releases the port before the child binds it;
// a child that loses that race exits at start-up, WaitReady reports its
// output, and BindLost recognises it so that the starter (RetryBind,
// llamacpp.Start) tries another port. Linux only (process groups, Pdeathsig); elsewhere Start works but
// Stop cannot reach grandchildren and Supported is false.
package child
