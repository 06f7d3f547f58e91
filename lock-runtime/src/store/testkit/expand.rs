//! `store_contract!`: the cases as one module of tests per store.

/// Expands the contract into a module of tests, one per case:
/// `store_contract!(memory_contract, make)`, or with the cases whose
/// ability the store lacks, `store_contract!(redis_contract, make, skip:
/// [a_forced_release_is_pushed_to_the_holder, ...])`, where `make` is an
/// async fn returning a [`Clients`](crate::store::testkit::Clients). A skipped
/// case is a test that checks the store indeed lacks its ability (and
/// `the_skipped_cases_are_the_missing_abilities` says which were skipped).
#[macro_export]
macro_rules! store_contract {
    ($module:ident, $make:path) => {
        $crate::store_contract!($module, $make, skip: []);
    };
    ($module:ident, $make:path, skip: [$($skip:ident),* $(,)?]) => {
        $crate::__contract_cases!(store_contract @module ($) $module, $make, [$($skip),*]);
    };
    (@module ($d:tt) $module:ident, $make:path, [$($skip:ident),*] cases [$($case:ident),*]) => {
        mod $module {
            use super::*;

            macro_rules! contract_case {
                $(
                    ($skip) => {
                        #[test]
                        fn $skip() {
                            $crate::store::testkit::run(async {
                                let store = $make().await;
                                let applies =
                                    $crate::store::testkit::applies(stringify!($skip), &store).await;
                                assert!(!applies);
                            });
                        }
                    };
                )*
                ($d case:ident) => {
                    #[test]
                    fn $d case() {
                        $crate::store::testkit::run(async {
                            let store = $make().await;
                            $crate::store::testkit::$d case(&store).await;
                        });
                    }
                };
            }

            $(contract_case!($case);)*

            #[test]
            fn the_skipped_cases_are_the_missing_abilities() {
                $crate::store::testkit::run(async {
                    let store = $make().await;
                    $crate::store::testkit::the_skipped_cases_are_the_missing_abilities(
                        ::core::module_path!(),
                        &store,
                        &[$(stringify!($skip)),*],
                    )
                    .await;
                });
            }
        }
    };
}

/// The contract's cases, listed once: `store_contract!` expands them and
/// [`CASES`](crate::store::testkit::CASES) names them from this list.
#[doc(hidden)]
#[macro_export]
macro_rules! __contract_cases {
    (@with [store_contract $($args:tt)*] [$($case:ident),*]) => {
        $crate::store_contract! { $($args)* cases [$($case),*] }
    };
    (@with [names] [$($case:ident),*]) => {
        [$(::core::stringify!($case)),*]
    };
    ($($then:tt)*) => {
        $crate::__contract_cases! { @with [$($then)*] [
            acquire_is_exclusive,
            racing_clients_never_both_win,
            keys_of_any_characters_stay_distinct,
            an_expired_lease_is_free_and_stale,
            only_the_holder_renews_or_releases,
            a_lingering_release_keeps_the_lease_that_long,
            fencing_tokens_increase_across_holders,
            a_token_issued_on_demand_is_the_holders_alone,
            a_watch_fires_on_release_and_only_then,
            a_lease_knows_when_others_may_wait,
            a_hand_over_moves_the_lease_to_a_new_token,
            a_forced_release_frees_the_key_and_tells_the_holder,
            a_forced_release_is_pushed_to_the_holder,
            an_abandoned_acquire_leaves_no_lease,
            an_abandoned_waiter_leaves_nothing_queued,
            inspect_reports_the_holder,
            the_capabilities_are_consistent,
            shares_hold_together_and_an_exclusive_claim_alone,
            a_semaphore_admits_up_to_its_limit,
            a_handed_over_permit_keeps_its_place,
            each_permit_expires_renews_and_fences_alone,
            the_claim_rule_holds_for_every_pair,
            a_forced_release_frees_every_share,
            a_waiting_exclusive_claim_stops_new_shares
        ] }
    };
}
