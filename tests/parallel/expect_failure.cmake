# Runs a command that must fail: `cmake -DCOMMAND=... -DEXPECT=... -DSECONDS=N
# -P expect_failure.cmake`. Passes when the command exits non-zero within N
# seconds and its output matches every regular expression in EXPECT (a list
# separated by '|;|'); prints the output either way.
string(REPLACE "|;|" ";" expectations "${EXPECT}")
separate_arguments(command UNIX_COMMAND "${COMMAND}")
string(TIMESTAMP start "%s")
execute_process(COMMAND ${command} RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err
                TIMEOUT ${SECONDS})
string(TIMESTAMP stop "%s")
math(EXPR elapsed "${stop} - ${start}")
message("${out}${err}")
message("exit: ${result}, after ${elapsed} s (limit ${SECONDS} s)")
if(result EQUAL 0)
  message(FATAL_ERROR "the command succeeded; it should have failed")
endif()
if(result MATCHES "timeout")
  message(FATAL_ERROR "the command did not end within ${SECONDS} s")
endif()
foreach(expected IN LISTS expectations)
  if(NOT "${out}${err}" MATCHES "${expected}")
    message(FATAL_ERROR "the output does not say: ${expected}")
  endif()
endforeach()
