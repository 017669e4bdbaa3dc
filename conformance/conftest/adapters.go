package conftest

// AdapterSmoke names the conformance cases the adapter modules (bunlock,
// sqlxlock) run through their constructors, on every dialect they map
// (SQLite and PostgreSQL), with conformance.RunCases.
//
// An adapter changes only how a Locker is built: it picks the dialect and
// hands the engine the *sql.DB under the bun.DB or sqlx.DB. The whole suite
// already runs on every dialect in the dialect packages, so running it again
// through each adapter (91 cases per dialect) proved nothing new and cost
// most of CI's time. What can go wrong in an adapter is the Locker it
// builds: the wrong dialect, another pool than the one given, options
// dropped. Each case below drives the adapter-built Locker through one path
// that would break in that case, and none needs a child process (a child
// builds its Locker with lock.New, so it would not test the adapter):
//
//   - S1_ExclusiveExcludesAll, S1_SharedCoexistAndExcludeExclusive: acquire
//     and release in both modes, and the conflicts between them, on the
//     case's tables (a wrong dialect or namespace shows here).
//   - S3_TokensIncreasePerKey: tokens granted through the adapter's Locker
//     grow per key across release and reacquire.
//   - F1_FencedTxOnLiveLeaseCommits: a fenced transaction on a live lease
//     commits (the fence statement of the inferred dialect).
//   - F2_TakenOverLeaseCannotWrite, F2_LossDuringFencedTxRollsBack: fenced
//     writes after a takeover, and during a loss, commit nothing.
//   - H2_TransientRenewalErrorKeepsLease,
//     H2_PersistentRenewalFailureLosesBeforeTakeover: renewal faults are
//     injected into the pool the case hands the adapter, so these pass only
//     if the adapter's Locker renews on that pool, with the TTL and renew
//     options passed through.
//   - H3_DeletedLeaseRowSignalsLoss: a lease whose row is gone is reported
//     lost by the renewer.
//   - H5_ReleaseWithCancelledContextDeletes: release deletes the row even
//     on a cancelled context.
//
// The adapters' own tests cover the rest of their surface: dialect
// inference and its errors, Migrate, RunInTx over bun.Tx and *sqlx.Tx
// (F1/F2 through the adapter's transaction type), and a bun and a sqlx
// application contending on one key.
var AdapterSmoke = []string{
	"S1_ExclusiveExcludesAll",
	"S1_SharedCoexistAndExcludeExclusive",
	"S3_TokensIncreasePerKey",
	"F1_FencedTxOnLiveLeaseCommits",
	"F2_TakenOverLeaseCannotWrite",
	"F2_LossDuringFencedTxRollsBack",
	"H2_TransientRenewalErrorKeepsLease",
	"H2_PersistentRenewalFailureLosesBeforeTakeover",
	"H3_DeletedLeaseRowSignalsLoss",
	"H5_ReleaseWithCancelledContextDeletes",
}
