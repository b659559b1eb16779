/* tools/version.h — the mpengine version, printed by `mpengine version`. */
#ifndef MPENGINE_TOOLS_VERSION_H
#define MPENGINE_TOOLS_VERSION_H
#define MPENGINE_VERSION "0.1.0"
#endif
