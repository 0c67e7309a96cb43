package broker

// SetCommitHook makes b call fn right after it stores an outcome and before it
// publishes the decided event: the window a crash test aims at.
func (b *Broker) SetCommitHook(fn func(id string)) { b.afterCommit = fn }
