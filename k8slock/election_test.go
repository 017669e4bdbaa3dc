package k8slock_test

const candidateEnv = "K8SLOCK_CANDIDATE"

func runCandidate() int { return 0 }
