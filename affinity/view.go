package affinity

// View is the read-only state a Policy ranks from (index, load). Filled in by router.go.
type View struct{}
