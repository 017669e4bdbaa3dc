package mysqldialect

// PrimaryQuery exports primaryQuery to the package's external tests until
// Statements carries it.
const PrimaryQuery = primaryQuery
