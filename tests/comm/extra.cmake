# The MPI backend's tests: test_comm under mpirun with 1 to 8 ranks (oversubscribed on small machines).
# OpenMPI refuses to run as root without the two OMPI_ALLOW_* variables (set here as well as in CI).
if(MPI_CXX_FOUND AND MPIEXEC_EXECUTABLE)
  foreach(np 1 2 3 4 5 6 7 8)
    add_test(NAME comm_mpi_np${np}
      COMMAND ${MPIEXEC_EXECUTABLE} --oversubscribe --bind-to none -np ${np}
              $<TARGET_FILE:test_comm> --gtest_filter=Mpi*)
    set_tests_properties(comm_mpi_np${np} PROPERTIES TIMEOUT 300
      ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_mpi_yield_when_idle=1")
  endforeach()
endif()

# The shm collectives and the closed-form sweep again with 4 KB slots: hundreds of chunks per operation, so
# every chunk-boundary and double-buffering case is hit at small sizes.
add_test(NAME comm_shm_tiny_slots
  COMMAND $<TARGET_FILE:test_comm> --gtest_filter=Sizes/ShmWorld.AllCollectivesMatchReference/*:ShmSplit.*:Ranks/ShmClosedForm.*)
set_tests_properties(comm_shm_tiny_slots PROPERTIES TIMEOUT 300 ENVIRONMENT "MESHTRAIN_SHM_SLOT_KB=4")

# The same with every all_gather, out-of-place all_to_all and all_to_all_v on the single-copy (CMA) path (its
# threshold at 0; ShmClosedFormCounts adds all_to_all_v with the counts in a step of their own, 56 ranks).
add_test(NAME comm_shm_cma_gather
  COMMAND $<TARGET_FILE:test_comm> --gtest_filter=Sizes/ShmWorld.AllCollectivesMatchReference/*:Ranks/ShmClosedForm.*:ShmClosedFormCounts.*)
set_tests_properties(comm_shm_cma_gather PROPERTIES TIMEOUT 300 ENVIRONMENT "MESHTRAIN_SHM_CMA_GATHER_KB=0")
