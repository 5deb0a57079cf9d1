# cmake -DEXE=FILE -DDEST=DIR -P bundle_runtime_libs.cmake: copies the shared libraries FILE needs
# beyond glibc into DIR, so that the binary (RPATH $ORIGIN/lib) also runs on machines that lack
# them, e.g. the GPU machines, which have no Debian cpp-httplib.
# Emptied first: the RPATH would otherwise find last build's copies beside the system's.
file(REMOVE_RECURSE "${DEST}")
file(GET_RUNTIME_DEPENDENCIES
  EXECUTABLES "${EXE}"
  RESOLVED_DEPENDENCIES_VAR deps
  UNRESOLVED_DEPENDENCIES_VAR missing
  PRE_EXCLUDE_REGEXES "^(ld-linux.*|libc|libm|libdl|libpthread|librt|libresolv|libutil)\\.so.*"
  POST_EXCLUDE_REGEXES "/ld-linux[^/]*$")
if(missing)
  message(FATAL_ERROR "${EXE} needs libraries that were not found: ${missing}")
endif()
file(MAKE_DIRECTORY "${DEST}")
foreach(dep ${deps})
  file(COPY "${dep}" DESTINATION "${DEST}" FOLLOW_SYMLINK_CHAIN)
endforeach()
