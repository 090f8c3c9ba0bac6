// Only the public LMDB header: every mdb_* function is called directly from Swift.
#include <lmdb.h>
