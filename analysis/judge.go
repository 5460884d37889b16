package analysis

// Judge marks, on a whole recording's stacks, what the verdicts read
// beyond a stack's own fields: each thread's top of loop, the waits of
// a wait chain, the wake-ups passed on by idle peers. Analyze calls it;
// so does whoever categorizes stacks one by one (Rules.Categorize).
func Judge(stacks []Stack, r *Rules) {
	markLoops(stacks, r)
	markChainWaits(stacks, r)
	markPassedOn(stacks, r)
}
