# The multi-host tests exit 77 when this machine cannot make network namespaces (not root, no veth or bridge):
# CTest then reports them as skipped, not passed.
foreach(test py_test_hosts_layouts py_test_hosts_faults)
  if(TEST ${test})
    set_tests_properties(${test} PROPERTIES SKIP_RETURN_CODE 77)
  endif()
endforeach()
