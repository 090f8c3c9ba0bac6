// Debian's libsqlite3 is built with the session extension and the pre-update hook; these defines
// only make <sqlite3.h> declare their functions.
#define SQLITE_ENABLE_SESSION 1
#define SQLITE_ENABLE_PREUPDATE_HOOK 1
#include <sqlite3.h>
